"""`--vocab new`: the base vocabulary grown by the pieces a WordPiece vocabulary learnt on the corpus adds.

A domain's terms come out of a general vocabulary in many pieces (vocabulary.py measures it);
continued pretraining with a vocabulary of its own (SciBERT, PubMedBERT) cuts them fewer times.
Learning a whole new vocabulary would orphan the checkpoint's embeddings, so, as exBERT and
AdaLM do, the pieces the corpus's own vocabulary (train-tokenizer's code, the base's casing)
has and the base lacks are appended: old ids keep their rows and the checkpoint stays valid.
Each new piece starts from the mean embedding (and MLM bias) of the old pieces the old
vocabulary spells it with, so it begins where the model already understood it, and continued
MLM moves it from there.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from ..input_files import blank_line_blocks
from ..models.heads import BertForPreTraining
from ..models.new_tokens import add_token_embeddings
from ..search.corpus import chunked
from ..tokenization.tokenizer import BertTokenizer
from ..tokenization.vocab_training import SPECIAL_TOKENS
from .vocabulary import counted_fragmentation, word_counts

CONTINUATION = "##"


def corpus_pieces(text_file: Path, tokenizer: BertTokenizer, vocab_size: int) -> list[str]:
    """Pieces of a `vocab_size` WordPiece vocabulary learnt on text_file that `tokenizer` lacks, in the order learnt.

    Only pieces the grown tokenizer then uses on the file are kept: WordPiece takes the longest
    match, so a piece never chosen on the corpus would be an embedding row no text reaches
    (dropping one changes no tokenization of the corpus).
    """
    learnt = BertTokenizer.train([text_file], vocab_size=vocab_size, lowercase=tokenizer.do_lower_case,
                                 strip_accents=tokenizer.strip_accents).vocab
    known = tokenizer.vocab
    new = [piece for piece in sorted(learnt, key=learnt.get) if piece not in known and piece not in SPECIAL_TOKENS]
    grown = tokenizer.with_pieces(new)
    used = Counter()
    for texts in chunked(blank_line_blocks(text_file), 1000):  # the file streams: it may be larger than memory
        used.update(i for ids in grown(texts, add_special_tokens=False)["input_ids"] for i in ids
                    if i >= tokenizer.vocab_size)
    return [piece for piece, new_id in zip(new, grown.convert_tokens_to_ids(new)) if used[new_id]]


def old_pieces(piece: str, vocab: dict[str, int]) -> list[str]:
    """How `vocab` spells `piece` (a "##" piece as the inside of a word): WordPiece's greedy longest match
    first, as the tokenizer splits a word; ["[UNK]"] when some character has no piece.

    (The tokenizer itself only splits from the start of a word; a "##" piece needs "##" pieces throughout.)
    """
    inside = piece.startswith(CONTINUATION) and len(piece) > len(CONTINUATION)
    text = piece[len(CONTINUATION):] if inside else piece
    pieces, start = [], 0
    while start < len(text):
        prefix = CONTINUATION if start or inside else ""
        end = next((end for end in range(len(text), start, -1) if prefix + text[start:end] in vocab), None)
        if end is None:
            return ["[UNK]"]
        pieces.append(prefix + text[start:end])
        start = end
    return pieces or ["[UNK]"]


def grow_checkpoint(source: Path, target: Path, pieces: list[str]) -> BertTokenizer:
    """Write `source` with `pieces` appended to its vocabulary to `target`: each new embedding row (and MLM
    bias) the mean of its old pieces' (`old_pieces`). Returns the grown tokenizer (also saved there)."""
    tokenizer = BertTokenizer.from_pretrained(source)
    model = BertForPreTraining.from_pretrained(source)  # what pretraining trains; an MLM-only head gains NSP
    vocab, embeddings = tokenizer.vocab, model.bert.embeddings.word_embeddings.weight.detach()
    bias = model.cls.predictions.bias.detach()
    spelled = [torch.tensor([vocab[p] for p in old_pieces(piece, vocab)]) for piece in pieces]
    rows = torch.stack([embeddings[ids].mean(0) for ids in spelled]) if pieces else embeddings[:0]
    add_token_embeddings(model, rows, torch.stack([bias[ids].mean() for ids in spelled]) if pieces else None)
    grown = tokenizer.with_pieces(pieces)
    model.save_pretrained(target, tokenizer=grown)
    return grown


def vocabulary_change(texts: Iterable[str], before: BertTokenizer, after: BertTokenizer) -> dict:
    """The pieces `after` adds to `before`, and what they do to the corpus (`texts`, read once): pieces per word
    and share of words split, before and after."""
    counts = word_counts(texts)

    def summary(tokenizer: BertTokenizer) -> dict:
        report = counted_fragmentation(counts, tokenizer)
        return {"vocab_size": tokenizer.vocab_size, "pieces_per_word": report.pieces_per_word,
                "split_share": report.split_share}

    added = after.convert_ids_to_tokens(list(range(before.vocab_size, after.vocab_size)))
    return {"added": len(added), "examples": added[:20], "before": summary(before), "after": summary(after)}
