"""Labelled tables for fine-tuning: rows of one or two texts with a label, the label space, and windows of ids.

Three steps, each checked where user data enters:
- `read_rows`: a .csv, .tsv or .jsonl file → texts, raw labels and line numbers; bad rows are
  skipped with a warning that names file:line, so one empty cell never stops a run half-way.
- `LabelSpace`: which labels exist and what kind of problem it is (the Hugging Face
  `problem_type` names), built from training labels or from a fine-tuned model's config.
- `encode_windows`: texts → [CLS] A [SEP] (B [SEP]) id lists. A single text too long for one
  sequence becomes overlapping windows (scored one by one, then combined per document by
  `bertforge.long_documents`); a pair that does not fit is truncated longest-first.
"""
from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .corpus import jsonl_objects

logger = logging.getLogger(__name__)

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
DELIMITERS = {".csv": ",", ".tsv": "\t"}
JSONL_SUFFIX = ".jsonl"
_MAX_LISTED = 10  # unknown labels or skipped rows named in one message; the rest are counted


# ---------------------------------------------------------------- reading rows

@dataclass
class LabelledRows:
    """The usable rows of a labelled file, in file order.

    texts: 1 to max_texts texts per row, in `text_columns` order. labels: raw values (str from csv/tsv,
    the JSON value from jsonl, e.g. a list for multi-label), None when no label column was asked
    for. row_numbers: 1-based line where each row starts (for messages). skipped: one warning per
    row left out.
    """
    texts: list[tuple[str, ...]]
    labels: list | None
    row_numbers: list[int]
    skipped: list[str] = field(default_factory=list)
    ids: list | None = None  # the id_column's values, when one was asked for

    def __len__(self) -> int:
        return len(self.texts)


def read_rows(path: str | os.PathLike, *, text_columns: list[str], label_column: str | None = None,
              id_column: str | None = None, max_texts: int = 2) -> LabelledRows:
    """Read the texts (and labels) of a .csv, .tsv or .jsonl file; the suffix picks the format.

    id_column: also keep each row's value of this column in `ids` (e.g. the admission a chunk
    of a long note belongs to, so that chunk scores can be combined per admission).
    max_texts: how many text columns a row may have (3 for retrieval triplets).

    CSV/TSV need a header row; JSONL needs one JSON object per line. Rows with an empty text or
    an empty label are skipped, each with a warning in `skipped` and one logged summary.
    Raises ValueError for a missing file, an unknown suffix, 0 or more than 2 text columns, a
    column the file lacks (the message lists the columns found), a file that is not UTF-8, a
    line that is not a JSON object, a text that is not a string, or a file with no usable rows left.
    """
    path = Path(path)
    text_columns = list(text_columns)
    if not 1 <= len(text_columns) <= max_texts:
        raise ValueError(f"text_columns must name 1 to {max_texts} columns (e.g. a text, or a text pair), "
                         f"got {text_columns}")
    if not path.is_file():
        raise ValueError(f"labelled file {path} does not exist; check the path (relative paths start at {Path.cwd()})")
    suffix = path.suffix.lower()
    if suffix not in (*DELIMITERS, JSONL_SUFFIX):
        raise ValueError(f"{path}: unknown format {path.suffix!r}; use .csv, .tsv or .jsonl")
    columns = [*text_columns, *([label_column] if label_column is not None else []),
               *([id_column] if id_column is not None else [])]
    records = _jsonl_records(path, columns, text_columns) if suffix == JSONL_SUFFIX else _table_records(path, columns)

    rows = LabelledRows(texts=[], labels=[] if label_column is not None else None, row_numbers=[],
                        ids=[] if id_column is not None else None)
    total = 0
    try:
        for line_number, values in records:
            total += 1
            problem = _row_problem(values, text_columns, label_column)
            if problem is not None:
                rows.skipped.append(f"{path.name}:{line_number}: {problem}; row skipped")
                continue
            rows.texts.append(tuple(values[column] for column in text_columns))
            if label_column is not None:
                rows.labels.append(values[label_column])
            if id_column is not None:
                rows.ids.append(values[id_column])
            rows.row_numbers.append(line_number)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 (byte {error.object[error.start]:#x} at offset {error.start} after "
                         f"{total} rows); re-save the file as UTF-8") from None
    except csv.Error as error:
        raise ValueError(f"{path}: row after line {rows.row_numbers[-1] if rows.row_numbers else 1} "
                         f"cannot be parsed ({error}); fix or remove it") from None

    if rows.skipped:
        logger.warning("%s: skipped %d of %d rows; first: %s", path, len(rows.skipped), total, rows.skipped[0])
    if not rows.texts:
        detail = f" ({len(rows.skipped)} skipped; first: {rows.skipped[0]})" if rows.skipped else ""
        raise ValueError(f"{path}: no usable rows{detail}; check the file and the column names")
    return rows


def _row_problem(values: dict | str, text_columns: list[str], label_column: str | None) -> str | None:
    """Why a row cannot be used, or None when it can."""
    if isinstance(values, str):  # the reader already found the row malformed
        return values
    for column in text_columns:
        if values[column] is None or not values[column].strip():
            return f"empty text in column {column!r}"
    if label_column is not None:
        label = values[label_column]
        if label is None or (isinstance(label, str) and not label.strip()):
            return f"empty label in column {label_column!r}"
    return None


def _table_records(path: Path, columns: list[str]):
    """(start line, {column: str}) for each data row of a CSV/TSV file with a header; a str instead
    of the dict says why the row is malformed."""
    # newline="" lets the csv module handle quoted fields that span lines.
    with open(path, encoding="utf-8-sig", newline="") as file:
        reader = csv.reader(file, delimiter=DELIMITERS[path.suffix.lower()])
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: the file is empty; it needs a header row naming its columns")
        header = [name.strip() for name in header]
        _check_columns(path, columns, header)
        position = {name: header.index(name) for name in columns}
        previous_end = reader.line_num
        for row in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                yield start, (f"{len(row)} fields but the header has {len(header)} "
                              "(an unquoted delimiter or quote inside a text?)")
                continue
            yield start, {name: row[index] for name, index in position.items()}


def _jsonl_records(path: Path, columns: list[str], text_columns: list[str]):
    """(line, {column: value}) for each non-blank line of a JSONL file."""
    for line_number, record in jsonl_objects(path):
        _check_columns(path, columns, list(record), where=f"{path}:{line_number}")
        for column in text_columns:
            if record[column] is not None and not isinstance(record[column], str):
                raise ValueError(f"{path}:{line_number}: field {column!r} holds {type(record[column]).__name__}, "
                                 "not a str; texts must be JSON strings")
        yield line_number, {column: record[column] for column in columns}


def _check_columns(path: Path, wanted: list[str], found: list[str], where: str | None = None) -> None:
    missing = [column for column in wanted if column not in found]
    if missing:
        raise ValueError(f"{where or path}: no column {missing[0]!r} (found {found}); "
                         "pass text_columns= / label_column= with the file's own names")


# ---------------------------------------------------------------- the label space

@dataclass
class LabelSpace:
    """The labels of a task and how they are scored, with Hugging Face config names.

    labels: the class names, in id order (infer sorts them: numerically when all are integers,
    else as strings); empty for regression, which has one output. label_separator splits a
    CSV cell into its labels for multi-label problems.
    """
    problem_type: str
    labels: list[str]
    label_separator: str = "|"

    def __post_init__(self):
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"unknown problem_type {self.problem_type!r}; use one of {PROBLEM_TYPES}")

    @property
    def num_labels(self) -> int:
        return 1 if self.problem_type == "regression" else len(self.labels)

    @property
    def id2label(self) -> dict[int, str]:
        # Regression keeps one named output so that BertConfig.num_labels (len of id2label) is 1.
        if self.problem_type == "regression":
            return {0: "LABEL_0"}
        return dict(enumerate(self.labels))

    @property
    def label2id(self) -> dict[str, int]:
        return {label: index for index, label in self.id2label.items()}

    @classmethod
    def infer(cls, raw_labels: Sequence, problem_type: str | None = None, label_separator: str = "|") -> LabelSpace:
        """The label space of training labels (raw values as `read_rows` returns them).

        problem_type None means multi-label when any raw label is a list, else single-label;
        regression is never guessed. Raises ValueError for an unknown problem_type, a regression
        value that is not a finite number, no labels, or a single-label column with one class.
        """
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"unknown problem_type {problem_type!r}; use one of {PROBLEM_TYPES}")
        raw_labels = list(raw_labels)
        if not raw_labels:
            raise ValueError("no labels to infer a label space from; check the label column")
        if problem_type is None:
            is_multi = any(isinstance(value, list) for value in raw_labels)
            problem_type = "multi_label_classification" if is_multi else "single_label_classification"
        space = cls(problem_type, [], label_separator)
        if problem_type == "regression":
            for value in raw_labels:
                _as_float(value)
            return space
        if problem_type == "multi_label_classification":
            names = {name for value in raw_labels for name in space._label_set(value)}
        else:
            names = {_as_name(value) for value in raw_labels}
        if not names:
            raise ValueError("every row has an empty label set; a multi-label task needs at least one label")
        if problem_type == "single_label_classification" and len(names) == 1:
            raise ValueError(f"label column has one class {next(iter(names))!r}: a classifier needs at least two; "
                             "check the column or the filter")
        space.labels = _sorted_labels(names)
        return space

    @classmethod
    def from_config(cls, config) -> LabelSpace:
        """The label space a fine-tuned model was trained with, from its BertConfig (id2label, problem_type).

        problem_type None is read as transformers does: regression when there is one label,
        else single-label. Raises ValueError when the config has no id2label or its ids are not 0..n-1.
        """
        id2label = config.id2label
        if not id2label:
            raise ValueError("the model config has no id2label: it was not fine-tuned for classification; "
                             "fine-tune it first, or give the labels")
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(f"config id2label has ids {sorted(id2label)}; they must be 0..{len(id2label) - 1}")
        problem_type = config.problem_type or ("regression" if len(id2label) == 1 else "single_label_classification")
        labels = [] if problem_type == "regression" else [id2label[index] for index in range(len(id2label))]
        return cls(problem_type, labels)

    def encode(self, raw_labels: Sequence, row_numbers: Sequence[int] | None = None) -> torch.Tensor:
        """Raw labels → a tensor: (n,) int64 class ids, (n, num_labels) float multi-hot, or (n,) float values.

        Raises ValueError listing labels outside the space (with their row numbers, when given)
        and the known labels, or naming a regression value that is not a number.
        """
        raw_labels = list(raw_labels)
        row_numbers = list(row_numbers) if row_numbers is not None else list(range(1, len(raw_labels) + 1))
        if self.problem_type == "regression":
            return torch.tensor([_as_float(value, row) for value, row in zip(raw_labels, row_numbers)],
                                dtype=torch.float32)
        label2id, unknown = self.label2id, {}
        if self.problem_type == "multi_label_classification":
            encoded = torch.zeros(len(raw_labels), self.num_labels)
            for index, (value, row) in enumerate(zip(raw_labels, row_numbers)):
                for name in self._label_set(value):
                    if name in label2id:
                        encoded[index, label2id[name]] = 1.0
                    else:
                        unknown.setdefault(name, []).append(row)
        else:
            ids = []
            for value, row in zip(raw_labels, row_numbers):
                name = _as_name(value)
                if name not in label2id:
                    unknown.setdefault(name, []).append(row)
                ids.append(label2id.get(name, -1))
            encoded = torch.tensor(ids, dtype=torch.long)
        if unknown:
            listed = "; ".join(f"{name!r} (rows {', '.join(map(str, rows[:5]))}{', ...' if len(rows) > 5 else ''})"
                               for name, rows in list(unknown.items())[:_MAX_LISTED])
            raise ValueError(f"{len(unknown)} label(s) the model was not trained on: {listed}; "
                             f"known labels: {self.labels}")
        return encoded

    def _label_set(self, value) -> list[str]:
        """The labels of one multi-label value: a JSON list, or a cell split on label_separator."""
        if isinstance(value, list):
            return [_as_name(item) for item in value]
        return [name.strip() for name in str(value).split(self.label_separator) if name.strip()]


def _as_name(value) -> str:
    """A label value as its class name: CSV strings stripped, JSON scalars as their text."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"label {value!r} is a {type(value).__name__}; a single-label task needs one value per "
                         "row (for several labels per row use problem_type='multi_label_classification')")
    return value.strip() if isinstance(value, str) else str(value)


def _as_float(value, row: int | None = None) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        where = f" (row {row})" if row is not None else ""
        raise ValueError(f"regression label {value!r}{where} is not a finite number; fix the value or drop the row")
    return number


def _sorted_labels(names: set[str]) -> list[str]:
    # "2" before "10": integer labels sort by value so that ids follow the numbers users expect
    # (the name breaks ties such as "01" and "1", so the order never depends on set order).
    try:
        return sorted(names, key=lambda name: (int(name), name))
    except ValueError:
        return sorted(names)


# ---------------------------------------------------------------- windows of token ids

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
    longest = max(len(windows.input_ids[index]) for index in indices)
    batch = {}
    for name, pad in (("input_ids", windows.pad_token_id), ("token_type_ids", 0), ("attention_mask", 0)):
        rows = getattr(windows, name)
        batch[name] = torch.tensor([rows[index] + [pad] * (longest - len(rows[index])) for index in indices],
                                   dtype=torch.long)
    if windows.labels is not None:
        batch["labels"] = windows.labels[[windows.document_index[index] for index in indices]]
    return batch


def encode_windows(tokenizer, texts: list[tuple[str, ...]], max_length: int = 128, stride: int = 32,
                   max_windows: int | None = None, labels: torch.Tensor | None = None) -> Windows:
    """Tokenize rows of 1 or 2 texts into [CLS] A [SEP] (B [SEP]) windows of at most max_length ids.

    A single text longer than max_length - 2 pieces is cut into windows of max_length - 2 pieces,
    each overlapping the previous one by `stride` pieces (the last may be shorter); max_windows
    keeps only a document's first windows (counted in `capped_documents`). A pair that does not
    fit is truncated longest-first, one piece at a time from the longer text, as BERT's
    `_truncate_seq_pair` does (counted in `truncated_pairs`). labels: optional per-row labels
    kept on the result for collate. Raises ValueError for no rows, rows of mixed or bad width,
    or a max_length / stride (single texts only) / max_windows that cannot work.
    """
    texts = [tuple(row) for row in texts]
    if not texts:
        raise ValueError("no texts to encode; check the data file")
    width = len(texts[0])
    if width not in (1, 2) or any(len(row) != width for row in texts):
        raise ValueError("every row needs the same number of texts, 1 or 2 (a text pair); "
                         f"got widths {sorted({len(row) for row in texts})}")
    needed = 1 + 2 * width  # [CLS], then a piece and a [SEP] per text
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < needed:
        raise ValueError(f"max_length must be an int >= {needed} ([CLS], [SEP]s and a piece per text), "
                         f"got {max_length!r}")
    if width == 1 and not 0 <= stride < max_length - 2:
        raise ValueError(f"stride (overlap between windows) must lie in [0, {max_length - 2}) for "
                         f"max_length={max_length}, got {stride!r}")
    if max_windows is not None and max_windows < 1:
        raise ValueError(f"max_windows must be a positive int or None (all windows), got {max_windows!r}")
    if labels is not None and len(labels) != len(texts):
        raise ValueError(f"{len(labels)} labels for {len(texts)} rows; pass one label per row")

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
    if windows.truncated_pairs or windows.capped_documents:
        logger.info("encode_windows: %d of %d pairs truncated to %d ids, %d documents capped at %s windows",
                    windows.truncated_pairs, len(texts), max_length, windows.capped_documents, max_windows)
    return windows


def _window_starts(length: int, size: int, stride: int) -> list[int]:
    """Start of each window of `size` pieces over `length` pieces, consecutive windows sharing `stride`."""
    starts = [0]
    while starts[-1] + size < length:
        starts.append(starts[-1] + size - stride)
    return starts


def _truncated_pair_lengths(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths after BERT's loop (pop from the longer text; from B on a tie) until both fit in budget."""
    excess = length_a + length_b - budget
    if excess <= 0:
        return length_a, length_b
    # The loop first evens the two out, then takes from B and A in turn (B first): closed form of that.
    cut = min(abs(length_a - length_b), excess)
    if length_a > length_b:
        length_a -= cut
    else:
        length_b -= cut
    excess -= cut
    return length_a - excess // 2, length_b - (excess + 1) // 2
