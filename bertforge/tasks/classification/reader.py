"""Labelled tables for fine-tuning: rows of one or two texts with a label (this module), the label space
(`labels`), and windows of ids (`windows`).

Three steps, each checked where user data enters:
- `read_rows`: a .csv, .tsv or .jsonl file → texts, raw labels and line numbers; bad rows are
  skipped with a warning that names file:line, so one empty cell never stops a run half-way.
- `LabelSpace`: which labels exist and what kind of problem it is (the Hugging Face
  `problem_type` names), built from training labels or from a fine-tuned model's config.
- `encode_windows`: texts → [CLS] A [SEP] (B [SEP]) id lists. A single text too long for one
  sequence becomes overlapping windows (scored one by one, then combined per document by
  `bertforge.tasks.long_documents`); a pair that does not fit is truncated longest-first.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...input_files import (DELIMITERS, JSONL_SUFFIX, jsonl_objects, not_utf8, open_table, require_file, table_rows,
                           text_suffix)

logger = logging.getLogger(__name__)

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")
_MAX_LISTED = 10  # unknown labels or skipped rows named in one message; the rest are counted


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
    require_file(path, "labelled file")
    suffix = text_suffix(path).lower()  # a.csv.gz is a CSV file
    if suffix not in (*DELIMITERS, JSONL_SUFFIX):
        raise ValueError(f"{path}: unknown format {suffix!r}; use .csv, .tsv or .jsonl (optionally .gz / .xz)")
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
    except UnicodeDecodeError:  # a .jsonl file's (a table's is open_table's ValueError; a bad row table_rows')
        raise ValueError(not_utf8(path)) from None

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
    rows = table_rows(path)
    header = next(rows)[1]
    if header is None:
        raise ValueError(f"{path}: the file is empty; it needs a header row naming its columns")
    _check_columns(path, columns, header)
    position = {name: header.index(name) for name in columns}
    for start, row in rows:
        if len(row) != len(header):
            yield start, (f"{len(row)} fields but the header has {len(header)} "
                          "(an unquoted delimiter or quote inside a text?)")
            continue
        yield start, {name: row[index] for name, index in position.items()}


def _header(reader) -> list[str] | None:
    header = next(reader, None)
    return None if header is None else [name.strip() for name in header]


def table_columns(path: str | Path) -> list[str]:
    """The column names in a CSV/TSV file's header row ([] for an empty file)."""
    with open_table(path) as reader:
        return _header(reader) or []


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
