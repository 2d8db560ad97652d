"""Texts to windows of token ids: [CLS] A [SEP] (B [SEP]); a long single text becomes overlapping windows,
a pair that does not fit is truncated longest-first; and their collation into batches."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...train.collate import pad_rows
from ...validation import Bound, checked

logger = logging.getLogger("bertforge")


@dataclass
class Windows:
    """Model inputs, one row per window (unpadded id lists), and the row (document) each came from.

    A row that fits gives one window; a long single text gives several. labels: per-document
    labels (as `LabelSpace.encode` returns), handed to each of the document's windows by collate.
    """
    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    attention_mask: list[list[int]]
    document_index: list[int]
    pad_token_id: int = 0
    num_documents: int = 0
    truncated_pairs: int = 0
    capped_documents: int = 0
    labels: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The windows at `indices` as a padded batch; see `pad_batch`."""
        return pad_batch(self, indices)


def pad_batch(windows: Windows, indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """input_ids, token_type_ids, attention_mask: (batch, longest) int64, padded on the right;
    plus labels (batch, ...) taken from each window's document when `windows.labels` is set."""
    indices = list(indices)
    rows = {name: [getattr(windows, name)[index] for index in indices] for name in ("input_ids", "token_type_ids")}
    labels = None
    if windows.labels is not None:
        labels = {"labels": windows.labels[[windows.document_index[index] for index in indices]]}
    return pad_rows(rows, windows.pad_token_id, row_fields=labels)


def check_window_settings(texts: list[tuple[str, ...]], max_length, stride, max_windows, labels) -> int:
    """The rows' width (1, or 2 for pairs); ValueError for settings `encode_windows` cannot work with."""
    if not texts:
        raise ValueError("no texts to encode; check the data file")
    width = len(texts[0])
    if width not in (1, 2) or any(len(row) != width for row in texts):
        raise ValueError("every row needs the same number of texts, 1 or 2 (a text pair); "
                         f"got widths {sorted({len(row) for row in texts})}")
    needed = 1 + 2 * width  # [CLS], then a piece and a [SEP] per text
    checked("max_length", max_length, bound=Bound(needed, meaning="[CLS], [SEP]s and a piece per text"))
    if width == 1 and not 0 <= stride < max_length - 2:
        raise ValueError(f"stride (overlap between windows) must lie in [0, {max_length - 2}) for "
                         f"max_length={max_length}, got {stride!r}")
    if max_windows is not None:
        checked("max_windows", max_windows, bound=Bound(1, meaning="None: every window"))
    if labels is not None and len(labels) != len(texts):
        raise ValueError(f"{len(labels)} labels for {len(texts)} rows; pass one label per row")
    return width


def encode_windows(tokenizer, texts: list[tuple[str, ...]], max_length: int = 128, stride: int = 32,
                   max_windows: int | None = None, labels: torch.Tensor | None = None) -> Windows:
    """Tokenize rows of 1 or 2 texts into [CLS] A [SEP] (B [SEP]) windows of at most max_length ids.

    A single text longer than max_length - 2 pieces is cut into windows of max_length - 2 pieces,
    each overlapping the previous one by `stride` pieces (the last may be shorter); max_windows
    keeps only a document's first windows (counted in `capped_documents`). A pair that does not
    fit is truncated longest-first, one piece at a time from the longer text, as BERT's
    `_truncate_seq_pair` does (counted in `truncated_pairs`); either cut is said in one warning line.
    labels: optional per-row labels kept on the result for collate. Raises ValueError for no rows,
    rows of mixed or bad width, or a max_length / stride (single texts only) / max_windows that cannot work.
    """
    texts = [tuple(row) for row in texts]
    width = check_window_settings(texts, max_length, stride, max_windows, labels)

    first = tokenizer([row[0] for row in texts], add_special_tokens=False)["input_ids"]
    second = tokenizer([row[1] for row in texts], add_special_tokens=False)["input_ids"] if width == 2 else None
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    windows = Windows([], [], [], [], pad_token_id=tokenizer.pad_token_id, num_documents=len(texts), labels=labels)

    def add(document: int, pieces_a: list[int], pieces_b: list[int] | None = None) -> None:
        ids = [cls_id, *pieces_a, sep_id]
        type_ids = [0] * len(ids)
        if pieces_b is not None:
            ids += [*pieces_b, sep_id]
            type_ids += [1] * (len(pieces_b) + 1)
        windows.input_ids.append(ids)
        windows.token_type_ids.append(type_ids)
        windows.attention_mask.append([1] * len(ids))
        windows.document_index.append(document)

    for document, pieces in enumerate(first):
        if second is not None:
            length_a, length_b = _truncated_pair_lengths(len(pieces), len(second[document]), max_length - 3)
            windows.truncated_pairs += (length_a, length_b) != (len(pieces), len(second[document]))
            add(document, pieces[:length_a], second[document][:length_b])
            continue
        starts = _window_starts(len(pieces), max_length - 2, stride)
        if max_windows is not None and len(starts) > max_windows:
            starts = starts[:max_windows]
            windows.capped_documents += 1
        for start in starts:
            add(document, pieces[start:start + max_length - 2])
    _warn_cut_texts(windows, max_length, max_windows)
    return windows


def _warn_cut_texts(windows: Windows, max_length: int, max_windows: int | None) -> None:
    """One warning line per call when some text is not read: a pair cut to fit, or windows past max_windows
    left out. Predictions are made without that text, and the CLI shows warnings, not info."""
    cut = []
    if windows.truncated_pairs:
        cut.append(f"{windows.truncated_pairs} of {windows.num_documents} text pairs were cut to {max_length} "
                   "ids, the longer text first")
    if windows.capped_documents:
        cut.append(f"{windows.capped_documents} of {windows.num_documents} texts were cut to their first "
                   f"{max_windows} window(s) of {max_length} ids (max_windows={max_windows})")
    if cut:
        logger.warning("%s; the rest of those texts was not read", "; ".join(cut))


def _window_starts(length: int, size: int, stride: int) -> list[int]:
    """Start of each window of `size` pieces over `length` pieces, consecutive windows sharing `stride`."""
    starts = [0]
    while starts[-1] + size < length:
        starts.append(starts[-1] + size - stride)
    return starts


def _truncated_pair_lengths(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths of a text pair cut to fit `budget` pieces, the longer text first, as transformers' fast tokenizers cut
    them (tokenizers' LongestFirst, what the server's tokenizer and sentence-transformers' CrossEncoder do): the
    shorter text stays whole when cutting the longer one suffices, else each gets half, the odd piece going to the
    longer text (to B on a tie). BERT's original loop gave it to the other text: a server and `predict` read the
    same pair one piece apart."""
    if length_a + length_b <= budget:
        return length_a, length_b
    short, long = sorted((length_a, length_b))
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short, long = budget // 2, budget // 2 + budget % 2
    return (long, short) if length_a > length_b else (short, long)
