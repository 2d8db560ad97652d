"""Token classification (NER) data: CoNLL files in and out, splits, and word-to-piece label alignment.

File format, one token per line: `token<TAB>tag` (or space-separated; the tag is the last column,
so CoNLL-2003's `token POS chunk tag` reads too), a blank line between sentences, `-DOCSTART-`
lines skipped. A file whose first token line has one column is unlabelled input for prediction.

Labels sit on the first word piece of each word and -100 (what torch's cross entropy ignores)
everywhere else, as in transformers' token-classification examples; predictions are read back
from the same pieces by `words_from_logits`, so every word of every sentence gets exactly one tag.
"""
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...atomic import replaced_file
from ...input_files import not_utf8, open_bytes, require_file
from ...models.heads import IGNORE_INDEX
from ...train.collate import pad_rows
from ...validation import Bound, checked
from .schemes import ENTITY_TAG, schemes_used

logger = logging.getLogger(__name__)

OUTSIDE_TAG = "O"
DOCSTART = "-DOCSTART-"


# ---------------------------------------------------------------- sentences and files

@dataclass
class TaggedSentence:
    """One sentence: its words, their tags (None for unlabelled input) and the file line it starts on.

    Raises ValueError when tags and words differ in number.
    """
    words: list[str]
    tags: list[str] | None = None
    line: int = 0

    def __post_init__(self):
        if self.tags is not None and len(self.tags) != len(self.words):
            raise ValueError(f"sentence at line {self.line} has {len(self.words)} words but {len(self.tags)} "
                             "tags; give one tag per word (or tags=None for unlabelled input)")


TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")


def check_not_a_table(path: Path) -> None:
    """A one-column table read as CoNLL is a word a line, tagged and written without a word: refused by its name."""
    if path.suffix.lower() in TABLE_SUFFIXES:
        raise ValueError(f"{path} does not look like CoNLL: it is named as a table ({path.suffix}), and NER reads "
                         "CoNLL files (a word a line, a blank line between sentences); convert it, or give the "
                         ".conll / .txt file")


def read_conll(path: str | os.PathLike, problems: list[str] | None = None) -> list[TaggedSentence]:
    """Read a CoNLL-style file into sentences (format in the module docstring).

    A malformed line (empty token or tag, a missing tag in a labelled file, extra columns in an
    unlabelled one) is skipped with a message "path:line: what; what to do" appended to
    `problems` when a list is given, and one summary warning is logged; reading goes on.
    Raises ValueError when the file does not exist, is named as a table (.csv, .tsv, .jsonl: a one-column
    table read as CoNLL is a word a line, tagged and written without a word), is not UTF-8, holds no sentence,
    or has more malformed token lines than good ones (it is not CoNLL: a CSV, say). `check_entity_tags` tells
    a labelled CoNLL file from plain text, which reads as a token and a "tag" per line.
    """
    path = Path(path)
    require_file(path, "CoNLL file")
    check_not_a_table(path)
    problems = [] if problems is None else problems
    already_reported = len(problems)
    sentences, words, tags, first_line = [], [], [], 0
    labelled, token_lines = None, 0  # labelled: decided by the first token line of the file

    def end_sentence():
        nonlocal words, tags
        if words:
            sentences.append(TaggedSentence(words, tags if labelled else None, first_line))
        words, tags = [], []

    for line_number, text in _lines(path):
        columns = [column.strip() for column in (text.split("\t") if "\t" in text else text.split())]
        if not any(columns):
            end_sentence()
            continue
        if columns[0] == DOCSTART:
            end_sentence()  # a document boundary is a sentence boundary, even without the blank line
            continue
        if labelled is None:
            labelled = len(columns) > 1
        token_lines += 1
        problem = _line_problem(columns, labelled)
        if problem:
            problems.append(f"{path}:{line_number}: {problem}")
            continue
        if not words:
            first_line = line_number
        words.append(columns[0])
        tags.append(columns[-1])
    end_sentence()

    skipped = len(problems) - already_reported
    if skipped:
        logger.warning("%s: skipped %d malformed line(s); first: %s", path, skipped, problems[already_reported])
    if not sentences:
        detail = f" ({skipped} malformed line(s) skipped, first: {problems[already_reported]})" if skipped else ""
        raise ValueError(f"CoNLL file {path} holds no sentences{detail}; expected `token<TAB>tag` lines "
                         "with a blank line between sentences")
    if skipped * 2 > token_lines:
        raise ValueError(f"{path} does not look like CoNLL: {skipped} of its {token_lines} token lines are malformed "
                         f"(first: {problems[already_reported]}); expected `token<TAB>tag` lines (or one token per "
                         "line, unlabelled) with a blank line between sentences")
    return sentences


def _lines(path: Path):
    """(line number, text without the line ending) for each line; ValueError naming the first non-UTF-8 line."""
    with open_bytes(path) as file:  # .gz / .xz too
        for line_number, raw in enumerate(file, start=1):
            try:
                text = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")  # a BOM is not part of the token
            except UnicodeDecodeError:
                raise ValueError(not_utf8(path)) from None
            yield line_number, text.rstrip("\r\n")


def _line_problem(columns: list[str], labelled: bool) -> str | None:
    """Why a token line cannot be used, or None when it is fine."""
    if not columns[0]:
        return "empty token (the line starts with a tab); remove the line or put the token back"
    if labelled and len(columns) == 1:
        return f"token {columns[0]!r} has no tag but the file is labelled; add its tag"
    if labelled and not columns[-1]:
        return f"token {columns[0]!r} has an empty tag; write O for no entity"
    if not labelled and len(columns) > 1:
        return (f"{len(columns)} columns in an unlabelled file (its first token line had one); "
                "give every line a tag or none")
    return None


def check_entity_tags(sentences: Sequence[TaggedSentence], path: str | os.PathLike) -> None:
    """Raise ValueError at the first tag that is not an entity tag (O, B-TYPE, I-TYPE, ...), or at a
    file that mixes BILOU's L-/U- tags with IOBES's E-/S- tags (no scoring mode reads both).

    Entity-level scoring needs such tags; and a plain-text file read as CoNLL has a "tag" on every
    line (its last word), which this catches before a model is trained or applied to it.
    """
    for sentence in sentences:
        bad = next((tag for tag in sentence.tags or () if not ENTITY_TAG.fullmatch(tag)), None)
        if bad is not None:
            raise ValueError(f"{path}: the sentence at line {sentence.line} has the tag {bad!r}, not an entity tag "
                             "(O, B-TYPE, I-TYPE, ...); is this a CoNLL file (`token<TAB>tag` per line, a blank "
                             "line between sentences)? Unlabelled input has one token per line")
    first_of_scheme = schemes_used((tag, sentence.line) for sentence in sentences for tag in sentence.tags or ())
    if len(first_of_scheme) > 1:
        (bilou, bilou_line), (iobes, iobes_line) = first_of_scheme["BILOU"], first_of_scheme["IOBES"]
        raise ValueError(f"{path}: the sentence at line {bilou_line} has the BILOU tag {bilou!r} but the one at line "
                         f"{iobes_line} has the IOBES tag {iobes!r}; convert the file to one tag scheme")


def write_conll(sentences: Sequence[TaggedSentence], path: str | os.PathLike) -> None:
    """Write sentences as `token<TAB>tag` lines (just `token` when unlabelled), a blank line after each.

    `read_conll` reads the file back to the same sentences. The file is written whole and then
    renamed into place; missing folders are made. Raises ValueError for a mix of labelled and
    unlabelled sentences, or a word or tag that the format cannot hold (empty, or with a tab or
    line break; a space too in an unlabelled word), naming the sentence.
    """
    labelled = {sentence.tags is not None for sentence in sentences}
    if len(labelled) > 1:
        raise ValueError("some sentences have tags and some do not; write them to separate files")
    lines = []
    for index, sentence in enumerate(sentences):
        where = f"sentence {index} (line {sentence.line})"
        for position, word in enumerate(sentence.words):
            tag = sentence.tags[position] if sentence.tags is not None else None
            _check_writable(word, "word", where, forbid_space=tag is None)
            if tag is not None:
                _check_writable(tag, "tag", where, forbid_space=True)
            lines.append(word if tag is None else f"{word}\t{tag}")
        lines.append("")
    with replaced_file(path) as temporary:
        temporary.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _check_writable(value, kind: str, where: str, forbid_space: bool) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError(f"{where}: {kind} {value!r} is empty, not a str or has surrounding whitespace; "
                         "a CoNLL line cannot hold it")
    if any(char in value for char in "\t\r\n") or (forbid_space and any(char.isspace() for char in value)):
        raise ValueError(f"{where}: {kind} {value!r} holds whitespace that would split the line; "
                         "replace it (e.g. with _)")
    if kind == "word" and value == DOCSTART:
        raise ValueError(f"{where}: the word {DOCSTART} would be read back as a document marker; rename it")


# ---------------------------------------------------------------- splits and tags

def split_tagged_sentences(sentences: Sequence[TaggedSentence], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                    seed: int | np.random.Generator = 0) -> tuple[list, list, list]:
    """Shuffle sentences with `seed` and cut them into (train, dev, test) by `fractions`.

    The same seed gives the same split; each part keeps the input order (so files written from it
    read like the source). Sizes are rounded at the cumulative boundaries, so they add up exactly.
    Raises ValueError for no sentences or fractions that are not three non-negative numbers
    summing to 1.
    """
    fractions = tuple(fractions)
    if (len(fractions) != 3 or any(not isinstance(f, (int, float)) or isinstance(f, bool) or f < 0 for f in fractions)
            or abs(sum(fractions) - 1) > 1e-6):
        raise ValueError(f"fractions must be three non-negative numbers (train, dev, test) summing to 1, "
                         f"got {fractions!r}; e.g. (0.8, 0.1, 0.1)")
    if not sentences:
        raise ValueError("no sentences to split; read a file with read_conll first")
    generator = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    order = generator.permutation(len(sentences))
    train_end = round(fractions[0] * len(sentences))
    dev_end = round((fractions[0] + fractions[1]) * len(sentences))
    parts = (order[:train_end], order[train_end:dev_end], order[dev_end:])
    train, dev, test = ([sentences[i] for i in sorted(part.tolist())] for part in parts)
    return train, dev, test


def tag_set(sentences: Sequence[TaggedSentence]) -> list[str]:
    """The tags used, "O" first (always present, so a word with no prediction has a label), then sorted.

    Build label2id from the tags of every split so dev and test tags are known:
    `{tag: i for i, tag in enumerate(tag_set(train + dev + test))}`.
    Raises ValueError when no sentence has tags.
    """
    tags = {tag for sentence in sentences if sentence.tags is not None for tag in sentence.tags}
    if not any(sentence.tags is not None for sentence in sentences):
        raise ValueError("no sentence has tags; tag_set needs labelled sentences (a file with token<TAB>tag lines)")
    return [OUTSIDE_TAG] + sorted(tags - {OUTSIDE_TAG})


# ---------------------------------------------------------------- features

@dataclass
class TaggedFeatures:
    """Model inputs for token classification: one row per sentence, or per span of a long sentence.

    input_ids, attention_mask, token_type_ids: per row, unpadded, [CLS] pieces [SEP].
    labels: per row, the word's label id on its first piece and -100 elsewhere; None when unlabelled.
    word_ids: per row, per token, the word's index within its sentence (None for [CLS]/[SEP]).
    sentence_index, first_word: per row, the sentence it came from and the first word it covers.
    sentence_lengths: words per sentence; pieceless_words: (sentence, word) of each word that
    tokenized to nothing (it gets "O" from `words_from_logits`); pad_token_id: for `pad_batch`.
    """
    input_ids: list[list[int]]
    attention_mask: list[list[int]]
    token_type_ids: list[list[int]]
    labels: list[list[int]] | None
    word_ids: list[list[int | None]]
    sentence_index: list[int]
    first_word: list[int] = field(default_factory=list)
    sentence_lengths: list[int] = field(default_factory=list)
    pieceless_words: list[tuple[int, int]] = field(default_factory=list)
    pad_token_id: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_for_tagging(tokenizer, sentences: Sequence[TaggedSentence], label2id: dict[str, int] | None,
                       max_length: int = 128) -> TaggedFeatures:
    """Tokenize sentences' words and align tag labels to their first pieces.

    A sentence whose pieces do not fit in max_length (with [CLS] and [SEP]) is cut into
    consecutive word spans that do, one row each, so no word loses its prediction; a single word
    longer than a row keeps only its first pieces (its label is on the first). label2id=None gives
    labels=None (prediction). Raises ValueError for max_length < 3, label2id with unlabelled
    sentences, or a tag missing from label2id (naming it and its sentence's line).
    """
    checked("max_length", max_length, bound=Bound(3, meaning="[CLS], one piece, [SEP]"))
    if not sentences:
        raise ValueError("no sentences to encode; read a file with read_conll first")
    if label2id is not None:
        _check_labels(sentences, label2id)
    # One batched call; a span's row is then a slice of its sentence's pieces, because pre-split
    # words are tokenized each on its own (what a second call on the span's words would give).
    encoding = tokenizer([list(sentence.words) for sentence in sentences], is_split_into_words=True,
                         add_special_tokens=True)
    features = TaggedFeatures([], [], [], [] if label2id is not None else None, [], [],
                              pad_token_id=tokenizer.pad_token_id)
    for index, sentence in enumerate(sentences):
        ids, word_ids = encoding["input_ids"][index][1:-1], encoding.word_ids(index)[1:-1]  # without [CLS]/[SEP]
        pieces_per_word = np.bincount(np.array([w for w in word_ids if w is not None], dtype=np.int64),
                                      minlength=len(sentence.words))
        features.sentence_lengths.append(len(sentence.words))
        features.pieceless_words.extend((index, word) for word in np.flatnonzero(pieces_per_word == 0).tolist())
        for first, end in _word_spans(pieces_per_word.tolist(), max_length - 2):
            positions = [p for p, w in enumerate(word_ids) if w is not None and first <= w < end][:max_length - 2]
            if not positions:
                continue  # every word of the span tokenized to nothing: no row to learn from or predict with
            row_word_ids = [None] + [word_ids[p] for p in positions] + [None]
            features.input_ids.append([tokenizer.cls_token_id] + [ids[p] for p in positions] + [tokenizer.sep_token_id])
            features.attention_mask.append([1] * len(row_word_ids))
            features.token_type_ids.append([0] * len(row_word_ids))
            features.word_ids.append(row_word_ids)
            features.sentence_index.append(index)
            features.first_word.append(first)
            if label2id is not None:
                features.labels.append([label2id[sentence.tags[w]] if first_piece else IGNORE_INDEX
                                        for w, first_piece in zip(row_word_ids, _first_pieces(row_word_ids))])
    return features


def _check_labels(sentences: Sequence[TaggedSentence], label2id: dict[str, int]) -> None:
    for sentence in sentences:
        if sentence.tags is None:
            raise ValueError(f"label2id given but the sentence at line {sentence.line} has no tags; "
                             "pass label2id=None to encode unlabelled input for prediction")
        unknown = [tag for tag in sentence.tags if tag not in label2id]
        if unknown:
            raise ValueError(f"tag {unknown[0]!r} of the sentence at line {sentence.line} is not in label2id; "
                             "build label2id from tag_set() over every split")


def _word_spans(pieces_per_word: list[int], capacity: int) -> list[tuple[int, int]]:
    """Consecutive [first, end) word ranges, each with at most `capacity` pieces (or one word that
    alone exceeds it). Greedy: spans are as long as they can be, so long sentences keep most context."""
    spans, first, used = [], 0, 0
    for word, pieces in enumerate(pieces_per_word):
        if used + pieces > capacity and used > 0:
            spans.append((first, word))
            first, used = word, 0
        used += pieces
    spans.append((first, len(pieces_per_word)))
    return spans


def _first_pieces(word_ids: list[int | None]) -> list[bool]:
    """Per token, whether it is the first piece of its word."""
    return [w is not None and (p == 0 or word_ids[p - 1] != w) for p, w in enumerate(word_ids)]


def pad_batch(features: TaggedFeatures, indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows `indices` padded on the right to the longest of them: (batch, seq) long tensors.

    input_ids pad with the tokenizer's [PAD] id, attention_mask and token_type_ids with 0, labels
    (present only when the features have them) with -100.
    """
    names = ("input_ids", "token_type_ids") + (("labels",) if features.labels is not None else ())
    return pad_rows({name: [getattr(features, name)[i] for i in indices] for name in names}, features.pad_token_id)


# ---------------------------------------------------------------- predictions back to words

def words_from_logits(features: TaggedFeatures, logits_per_row, id2label: dict[int, str] | Sequence[str],
                      sentence_lengths: Sequence[int] | None = None) -> list[list[str]]:
    """Per sentence, one predicted tag per word: the argmax at the word's first piece.

    logits_per_row: per feature row, an array or tensor (seq, num_labels) with seq >= the row's
    length (padded batch rows are fine; positions past the row are ignored). A word with no
    pieces gets "O". sentence_lengths defaults to the features' own. Raises ValueError when the
    number of rows or a row's length does not match the features, or a predicted id has no label.
    """
    sentence_lengths = features.sentence_lengths if sentence_lengths is None else list(sentence_lengths)
    if len(logits_per_row) != len(features):
        raise ValueError(f"got logits for {len(logits_per_row)} rows but the features have {len(features)}; "
                         "pass one (seq, num_labels) array per feature row, in order")
    predictions = [[OUTSIDE_TAG] * length for length in sentence_lengths]
    for row, logits in enumerate(logits_per_row):
        if isinstance(logits, torch.Tensor):
            logits = logits.detach().float().cpu().numpy()  # bf16 has no numpy dtype
        logits = np.asarray(logits)
        word_ids = features.word_ids[row]
        if logits.ndim != 2 or logits.shape[0] < len(word_ids):
            raise ValueError(f"row {row}: logits of shape {logits.shape} but the row has {len(word_ids)} tokens; "
                             "pass (seq, num_labels) per row with seq >= the row's length")
        label_ids = logits[:len(word_ids)].argmax(axis=-1)
        sentence = features.sentence_index[row]
        for position, is_first in enumerate(_first_pieces(word_ids)):
            if is_first:
                predictions[sentence][word_ids[position]] = _label(id2label, int(label_ids[position]))
    return predictions


def _label(id2label, label_id: int) -> str:
    try:
        return id2label[label_id]
    except (KeyError, IndexError):
        pass
    try:
        return id2label[str(label_id)]  # id2label read from a config.json has str keys
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"predicted label id {label_id} is not in id2label ({len(id2label)} labels); "
                         "the model's num_labels must match id2label") from None
