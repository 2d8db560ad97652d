"""A corpus tokenized once into memory-mapped arrays, and the reader for it.

Folder layout (format 1):
  tokens.bin            token ids of every sentence, concatenated (uint16 when the vocab fits, else int32)
  sentence_offsets.bin  int64, num_sentences + 1: sentence s is tokens[offsets[s]:offsets[s + 1]]
  document_offsets.bin  int64, num_documents + 1, in sentences: document d is sentences
                        [offsets[d], offsets[d + 1])
  vocab.txt             the vocabulary the ids index, so the folder explains itself
  meta.json             counts, dtype, vocab hash, sources (with their sizes and modification times,
                        so a cache can tell when they changed); written last, so its presence marks
                        a finished folder
Sentences of a document are adjacent in tokens.bin, so any run of sentences is one slice.
"""
import copy
import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ...atomic import append_array, staging_folder
from ...errors import UsageError
from ...input_files import fingerprints
from ...tokenization.vocab_training import reading_settings
from ...validation import checked
from .corpus import DOCUMENT_BOUNDARIES, TEXT_RULE, expand_paths, read_documents, split_sentences

FORMAT_VERSION = 1
FILES = ("tokens.bin", "sentence_offsets.bin", "document_offsets.bin", "vocab.txt", "meta.json")
SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}


def vocab_fingerprint(vocab: dict[str, int]) -> str:
    """sha256 of the tokens in id order: two vocabularies with the same hash give the same ids."""
    tokens = sorted(vocab, key=vocab.get)
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 halves the disk and page cache for vocabularies up to 65,536 tokens (BERT's is 30,522)."""
    return np.dtype(np.uint16) if vocab_size <= 2 ** 16 else np.dtype(np.int32)


def prepare_corpus(paths, tokenizer, output_dir: str | os.PathLike, document_boundary: str = "blank_line",
                   text_field: str = "text", batch_size: int = 1000, split_sentences=split_sentences,
                   overwrite: bool = False, progress: bool = True) -> "TokenizedCorpus":
    """Tokenize a corpus once into `output_dir` and open it; see `read_documents` for the input layouts.

    Documents are read as a stream and tokenized `batch_size` documents at a time through the
    tokenizer's multi-threaded batch path, each batch appended to the files, so memory holds one
    batch, never the corpus. Sentences that tokenize to nothing and documents left empty are
    dropped, as create_pretraining_data does. Raises ValueError for bad paths or records (see
    `read_documents`), batch_size < 1, an `output_dir` that already holds files (unless
    overwrite=True) and a corpus with no text.
    """
    checked("batch_size", batch_size)
    if document_boundary not in DOCUMENT_BOUNDARIES:
        raise ValueError(f"unknown document_boundary {document_boundary!r}; use one of {DOCUMENT_BOUNDARIES}")
    files = expand_paths(paths)  # fail on a missing file before any work
    sources = [str(path) for path in files]
    output_dir = Path(output_dir)
    _check_output_dir(output_dir, overwrite)
    vocab = tokenizer.vocab
    missing = [token for token in SPECIAL_TOKENS.values() if token not in vocab]
    if missing:
        raise ValueError(f"the tokenizer's vocabulary lacks {missing}; BERT pretraining needs all of "
                         f"{list(SPECIAL_TOKENS.values())}")
    dtype = token_dtype(len(vocab))
    documents = read_documents(sources, document_boundary, text_field, split_sentences)

    # Written in a hidden folder beside output_dir and moved in when complete: a kill at any point
    # leaves the previous corpus (or nothing), never a half-written one.
    with staging_folder(output_dir) as staging:
        counts = _write_token_files(documents, tokenizer, dtype, staging, batch_size, progress)
        if counts["tokens"] == 0:
            raise ValueError(f"no text found in {sources}; check the files (and text_field={text_field!r} for JSONL)")
        (staging / "vocab.txt").write_text("".join(token + "\n" for token in sorted(vocab, key=vocab.get)),
                                           encoding="utf-8")
        meta = {"format_version": FORMAT_VERSION, "dtype": dtype.name, "vocab_size": len(vocab),
                "vocab_sha256": vocab_fingerprint(vocab), **reading_settings(tokenizer),
                "special_token_ids": {name: vocab[token] for name, token in SPECIAL_TOKENS.items()},
                "num_documents": counts["documents"], "num_sentences": counts["sentences"],
                "num_tokens": counts["tokens"], "sources": sources, "source_files": fingerprints(files),
                "document_boundary": document_boundary, "text_field": text_field, "text_rule": TEXT_RULE}
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        _publish(staging, output_dir)
    return TokenizedCorpus(output_dir)


def _write_token_files(documents, tokenizer, dtype: np.dtype, output_dir: Path, batch_size: int,
                       progress: bool) -> dict:
    """Append the documents, batch by batch, to the three .bin files; return the counts."""
    counts = {"documents": 0, "sentences": 0, "tokens": 0}
    with open(output_dir / "tokens.bin", "wb") as tokens_file, \
            open(output_dir / "sentence_offsets.bin", "wb") as sentence_file, \
            open(output_dir / "document_offsets.bin", "wb") as document_file, \
            tqdm(desc="tokenizing", unit=" docs", disable=not progress) as bar:
        append_array(sentence_file, np.zeros(1, np.int64))
        append_array(document_file, np.zeros(1, np.int64))
        while batch := list(itertools.islice(documents, batch_size)):
            token_ids, sentence_lengths, document_sizes = _tokenize_batch(batch, tokenizer, dtype)
            append_array(tokens_file, token_ids)
            append_array(sentence_file, counts["tokens"] + np.cumsum(sentence_lengths))
            append_array(document_file, counts["sentences"] + np.cumsum(document_sizes))
            counts["documents"] += len(document_sizes)
            counts["sentences"] += len(sentence_lengths)
            counts["tokens"] += len(token_ids)
            bar.update(len(batch))
            bar.set_postfix(tokens=counts["tokens"], refresh=False)
    return counts


def _tokenize_batch(documents: list[list[str]], tokenizer, dtype: np.dtype):
    """(token ids (n_tokens,), tokens per sentence (n_sentences,), sentences per document (n_docs,)).

    Empty sentences and the documents they leave empty are dropped here.
    """
    sentences = [sentence for document in documents for sentence in document]
    ids = tokenizer(sentences, add_special_tokens=False)["input_ids"]
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    kept = lengths > 0
    document_of_sentence = np.repeat(np.arange(len(documents)), [len(document) for document in documents])
    document_sizes = np.bincount(document_of_sentence[kept], minlength=len(documents))
    token_ids = np.fromiter(itertools.chain.from_iterable(ids), dtype, count=int(lengths.sum()))
    return token_ids, lengths[kept], document_sizes[document_sizes > 0]


def _check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse a file, a folder of other files, or (without overwrite) a folder that holds a corpus."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"output_dir {output_dir} is a file; pass a folder path")
    if output_dir.is_dir() and any(not entry.name.startswith(".") for entry in output_dir.iterdir()):
        holds_corpus = any((output_dir / name).exists() for name in FILES)
        if not holds_corpus:
            raise ValueError(f"output_dir {output_dir} holds other files, not a prepared corpus; "
                             "refusing to overwrite it: choose an empty folder")
        if not overwrite:
            state = ("a prepared corpus" if (output_dir / "meta.json").is_file()
                     else "an incomplete corpus (its preparation was stopped)")
            raise UsageError(f"output_dir {output_dir} is not empty: it holds {state}; pass --overwrite "
                             "(overwrite=True) to prepare it again, or choose an empty folder")
    output_dir.mkdir(parents=True, exist_ok=True)


def _publish(staging: Path, output_dir: Path) -> None:
    """Move a finished corpus from `staging` into `output_dir`, meta.json (the mark of a whole corpus) last."""
    (output_dir / "meta.json").unlink(missing_ok=True)  # from here until the end, the folder reads as incomplete
    for name in FILES:
        if name != "meta.json":
            os.replace(staging / name, output_dir / name)
    os.replace(staging / "meta.json", output_dir / "meta.json")


class TokenizedCorpus:
    """A prepared corpus folder, memory-mapped: documents of sentences of token ids.

    `TokenizedCorpus(folder, tokenizer=None)`; with a tokenizer, raises ValueError when its
    vocabulary (or lower-casing) differs from the one the corpus was made with. `subset(indices)`
    gives a view of some documents (for a held-out split) that behaves like a whole corpus.
    """

    def __init__(self, folder: str | os.PathLike, tokenizer=None):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.is_file():
            hint = ("prepare was interrupted: run prepare_corpus again" if (self.folder / "tokens.bin").exists()
                    else "make one with prepare_corpus(paths, tokenizer, folder)")
            raise ValueError(f"{self.folder} is not a prepared corpus (no meta.json); {hint}")
        self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{self.folder} has corpus format {self.meta.get('format_version')}, this bertforge "
                             f"reads format {FORMAT_VERSION}; prepare the corpus again")
        self._open()
        self._documents = None  # None: every document, else the global indices of a subset view
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)

    def _open(self) -> None:
        # Plain ndarray views of the maps: slicing an np.memmap costs several times more.
        def mapped(name, dtype):
            return np.asarray(np.memmap(self.folder / name, dtype=dtype, mode="r"))

        self._tokens = mapped("tokens.bin", self.meta["dtype"])
        self._sentence_offsets = mapped("sentence_offsets.bin", np.int64)
        self._document_offsets = mapped("document_offsets.bin", np.int64)
        if (len(self._tokens), len(self._sentence_offsets), len(self._document_offsets)) != (
                self.meta["num_tokens"], self.meta["num_sentences"] + 1, self.meta["num_documents"] + 1):
            raise ValueError(f"{self.folder}: file sizes disagree with meta.json (truncated copy?); prepare it again")

    # Memory maps would be pickled as full copies of the data (DataLoader workers, spawn):
    # send the folder instead and map it again on the other side.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_tokens", "_sentence_offsets", "_document_offsets", "_vocab_tokens"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    # ---- sizes

    @property
    def num_documents(self) -> int:
        return self.meta["num_documents"] if self._documents is None else len(self._documents)

    @property
    def num_sentences(self) -> int:
        if self._documents is None:
            return self.meta["num_sentences"]
        return int((self._document_offsets[self._documents + 1] - self._document_offsets[self._documents]).sum())

    @property
    def num_tokens(self) -> int:
        if self._documents is None:
            return self.meta["num_tokens"]
        first = self._sentence_offsets[self._document_offsets[self._documents]]
        last = self._sentence_offsets[self._document_offsets[self._documents + 1]]
        return int((last - first).sum())

    def __len__(self) -> int:
        return self.num_documents

    # ---- reading

    def source_index(self, index: int) -> int:
        """The index of document `index` of this view in the prepared folder."""
        if not -self.num_documents <= index < self.num_documents:
            raise IndexError(f"document {index} out of range for a corpus of {self.num_documents} documents")
        index %= self.num_documents
        return index if self._documents is None else int(self._documents[index])

    def sentence_lengths(self, index: int) -> np.ndarray:
        """Tokens per sentence of document `index`: (num_sentences,) int64."""
        first, last = self._sentence_range(index)
        return np.diff(self._sentence_offsets[first:last + 1])

    def tokens(self, index: int, start: int = 0, end: int | None = None) -> np.ndarray:
        """Token ids of sentences [start, end) of document `index`, concatenated: (n,) int64.

        Raises IndexError unless 0 <= start <= end <= the document's number of sentences.
        """
        first, last = self._sentence_range(index)
        end = last - first if end is None else end
        if not 0 <= start <= end <= last - first:
            raise IndexError(f"sentences [{start}, {end}) out of range for document {index} "
                             f"of {last - first} sentences")
        return self._tokens[self._sentence_offsets[first + start]:self._sentence_offsets[first + end]].astype(np.int64)

    def document(self, index: int) -> list[np.ndarray]:
        """Document `index` as a list of sentences, each an (n,) int64 array of token ids."""
        first, last = self._sentence_range(index)
        bounds = self._sentence_offsets[first:last + 1]
        tokens = self._tokens[bounds[0]:bounds[-1]].astype(np.int64)
        return np.split(tokens, bounds[1:-1] - bounds[0])

    def _sentence_range(self, index: int) -> tuple[int, int]:
        document = self.source_index(index)
        return int(self._document_offsets[document]), int(self._document_offsets[document + 1])

    def subset(self, indices: Sequence[int]) -> "TokenizedCorpus":
        """A view of the documents `indices` (of this view), renumbered 0..len(indices)-1."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1 or len(indices) == 0:
            raise ValueError("subset needs a non-empty 1-D list of document indices")
        if indices.min() < 0 or indices.max() >= self.num_documents:
            raise ValueError(f"document indices must lie in [0, {self.num_documents}), "
                             f"got {indices.min()}..{indices.max()}")
        view = copy.copy(self)
        view._documents = indices if self._documents is None else self._documents[indices]
        return view

    # ---- vocabulary

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    cls_token_id = property(lambda self: self.meta["special_token_ids"]["cls"])
    sep_token_id = property(lambda self: self.meta["special_token_ids"]["sep"])
    mask_token_id = property(lambda self: self.meta["special_token_ids"]["mask"])
    pad_token_id = property(lambda self: self.meta["special_token_ids"]["pad"])

    @property
    def vocab_tokens(self) -> list[str]:
        """The vocabulary in id order (read from the folder's vocab.txt)."""
        if not hasattr(self, "_vocab_tokens"):
            text = (self.folder / "vocab.txt").read_text(encoding="utf-8")
            self._vocab_tokens = text.split("\n")[:-1]
        return self._vocab_tokens

    def check_tokenizer(self, tokenizer) -> None:
        """Raise ValueError unless `tokenizer` makes the same ids this corpus was made with."""
        fingerprint = vocab_fingerprint(tokenizer.vocab)
        if fingerprint != self.meta["vocab_sha256"]:
            raise ValueError(f"{self.folder} was tokenized with a different vocabulary (sha256 "
                             f"{self.meta['vocab_sha256'][:12]}…, {self.meta['vocab_size']} tokens) than this "
                             f"tokenizer's ({fingerprint[:12]}…, {len(tokenizer.vocab)} tokens); use the "
                             "tokenizer the corpus was prepared with, or prepare it again with this one")
        # Each reading setting the corpus recorded (one prepared before 2026-11-27 recorded do_lower_case alone)
        ran = reading_settings(tokenizer)
        differ = [name for name in ran if name in self.meta and ran[name] != self.meta[name]]
        if differ:
            then = ", ".join(f"{name}={self.meta[name]}" for name in differ)
            now = ", ".join(f"{name}={ran[name]}" for name in differ)
            raise ValueError(f"{self.folder} was tokenized with {then}, this tokenizer runs with {now}; the ids "
                             "would not match: use the tokenizer the corpus was prepared with, or prepare it again")

    def __repr__(self) -> str:
        return (f"TokenizedCorpus({str(self.folder)!r}, documents={self.num_documents}, "
                f"sentences={self.num_sentences}, tokens={self.num_tokens})")


def split_documents(corpus: TokenizedCorpus, heldout_fraction: float,
                    rng: np.random.Generator) -> tuple[TokenizedCorpus, TokenizedCorpus]:
    """(train, held-out) views with disjoint random documents; held-out gets round(fraction * n), at least 1.

    Splitting by document keeps held-out text unseen, also as a random "next sentence".
    Raises ValueError unless 0 < heldout_fraction < 1 and both sides get a document.
    """
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must lie strictly between 0 and 1, got {heldout_fraction!r}")
    num_heldout = max(1, round(heldout_fraction * corpus.num_documents))
    if num_heldout >= corpus.num_documents:
        raise ValueError(f"a corpus of {corpus.num_documents} documents cannot give {num_heldout} to held-out and "
                         "keep one for training; prepare more documents or hold out a separate prepared folder")
    order = rng.permutation(corpus.num_documents)
    return corpus.subset(np.sort(order[num_heldout:])), corpus.subset(np.sort(order[:num_heldout]))
