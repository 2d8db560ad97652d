"""Read MIMIC-III ADMISSIONS whole and stream NOTEEVENTS row by row; count every bad row.

ADMISSIONS is small (59k rows) and read into memory. NOTEEVENTS is ~4 GB, so `stream_notes`
yields one note at a time and the caller keeps only what its task needs. Both use the csv module,
which reads the multi-line quoted TEXT field correctly. Column names are matched without regard to
case (the MIMIC-III Postgres build writes them in lower case); extra columns are ignored.

Bad rows do not stop the run: each is counted in a `Report` under a key that says why, with the
first few row numbers as examples. Row numbers count data records from 1 (the header is row 0),
not file lines, because a note's TEXT spans many lines.
Dates are parsed as ClinicalBERT parses them (pandas `to_datetime` with the formats
'%Y-%m-%d %H:%M:%S' and '%Y-%m-%d'); where it turns a bad date into NaT and carries on, the row
is counted under `*_bad_date` and left out instead.
"""
import csv
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date, datetime

from ..input_files import open_table, require_file

ADMISSIONS_COLUMNS = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE")
NOTEEVENTS_COLUMNS = ("SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "CATEGORY", "TEXT")
DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S"
DATE_FORMAT = "%Y-%m-%d"
# Some discharge summaries are longer than the csv module's default 128 KiB field limit.
_FIELD_SIZE_LIMIT = 2**31 - 1


@dataclass
class Report:
    """Counts of what happened to every row, plus the first few row numbers of each problem.

    `counts` keys are flat names such as "admissions_read" or "notes_unknown_hadm_id";
    `datasets` holds the per-task, per-split statistics that `prepare` fills in.
    """
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)
    datasets: dict[str, dict] = field(default_factory=dict)
    max_examples: int = 5

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def problem(self, key: str, row: int) -> None:
        """Count one bad row under `key` and keep its row number if fewer than `max_examples` are kept."""
        self.add(key)
        rows = self.examples.setdefault(key, [])
        if len(rows) < self.max_examples:
            rows.append(row)

    def __getitem__(self, key: str) -> int:
        return self.counts.get(key, 0)

    def to_dict(self) -> dict:
        return {"counts": dict(self.counts), "examples": {k: list(v) for k, v in self.examples.items()},
                "datasets": self.datasets}


@dataclass(frozen=True)
class Admission:
    """One ADMISSIONS row with parsed times; `death_time` is None for patients who left alive."""
    subject_id: int
    hadm_id: int
    admit_time: datetime
    discharge_time: datetime
    death_time: datetime | None
    admission_type: str
    row: int


@dataclass(frozen=True)
class Note:
    """One NOTEEVENTS row; `chart_time` is the raw CHARTTIME string, often empty in MIMIC-III."""
    subject_id: int
    hadm_id: int
    chart_date: date
    chart_time: str
    category: str
    text: str
    row: int


def read_admissions(path: str | os.PathLike, report: Report) -> list[Admission]:
    """All usable ADMISSIONS rows, in file order.

    Counts every row under "admissions_read" and each left-out row under one of
    "admissions_bad_id" (SUBJECT_ID or HADM_ID not an integer), "admissions_duplicate_hadm_id"
    (the first row with an id is kept) and "admissions_bad_date" (ADMITTIME or DISCHTIME missing
    or unparseable, or a DEATHTIME that is present but unparseable).
    Raises ValueError for a missing file or missing columns.
    """
    admissions, seen = [], set()
    for row, values in _records(path, ADMISSIONS_COLUMNS):
        report.add("admissions_read")
        subject_id, hadm_id = _integer(values[0]), _integer(values[1])
        if subject_id is None or hadm_id is None:
            report.problem("admissions_bad_id", row)
            continue
        if hadm_id in seen:
            report.problem("admissions_duplicate_hadm_id", row)
            continue
        admit_time, discharge_time = _datetime(values[2]), _datetime(values[3])
        death_time = _datetime(values[4]) if values[4].strip() else None
        if admit_time is None or discharge_time is None or (values[4].strip() and death_time is None):
            report.problem("admissions_bad_date", row)
            continue
        seen.add(hadm_id)
        admissions.append(Admission(subject_id, hadm_id, admit_time, discharge_time, death_time,
                                    values[5].strip(), row))
    return admissions


def stream_notes(path: str | os.PathLike, report: Report) -> Iterator[Note]:
    """Yield NOTEEVENTS rows one at a time, never holding the file in memory.

    Counts every row under "notes_read" and each row not yielded under one of
    "notes_without_hadm_id" (empty HADM_ID: outpatient notes in MIMIC-III), "notes_bad_id"
    (SUBJECT_ID or HADM_ID not an integer) and "notes_bad_date" (CHARTDATE unparseable).
    Whether the HADM_ID is a known admission is for the caller to decide.
    Raises ValueError for a missing file or missing columns.
    """
    for row, values in _records(path, NOTEEVENTS_COLUMNS):
        report.add("notes_read")
        if not values[1].strip():
            report.problem("notes_without_hadm_id", row)
            continue
        subject_id, hadm_id = _integer(values[0]), _integer(values[1])
        if subject_id is None or hadm_id is None:
            report.problem("notes_bad_id", row)
            continue
        chart_date = _date(values[2])
        if chart_date is None:
            report.problem("notes_bad_date", row)
            continue
        # MIMIC-III writes some categories with a trailing space ("Physician ").
        yield Note(subject_id, hadm_id, chart_date, values[3].strip(), values[4].strip(), values[5], row)


def _records(path: str | os.PathLike, columns: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """(row number, values of `columns` in that order) for each data record of a CSV file."""
    path = require_file(path, "MIMIC-III file")
    # The limit is process-wide: raise it while this file is read, then give other readers theirs back.
    previous = csv.field_size_limit(max(csv.field_size_limit(), _FIELD_SIZE_LIMIT))
    try:
        with open_table(path) as reader:  # PhysioNet ships the tables as .csv.gz
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path} is empty; expected a CSV header with columns {list(columns)}")
            positions = {name.strip().upper(): index for index, name in enumerate(header)}
            missing = [name for name in columns if name not in positions]
            if missing:
                raise ValueError(f"{path}: missing columns {missing}; found {header}. "
                                 f"A MIMIC-III {path.stem.split('.')[0].upper()} table needs {list(columns)}")
            indices = [positions[name] for name in columns]
            width = max(indices) + 1
            for row, record in enumerate(reader, start=1):
                if not record:  # a blank line is no record (csv gives [] for it)
                    continue
                if len(record) < width:  # a short row reads as empty fields and is counted by its caller
                    record = record + [""] * (width - len(record))
                yield row, [record[index] for index in indices]
    finally:
        csv.field_size_limit(previous)


def _integer(text: str) -> int | None:
    text = text.strip()
    # pandas re-exports write integer ids of a column with gaps as floats ("167853.0").
    if text.endswith(".0"):
        text = text[:-2]
    try:
        return int(text)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1 << 16)
def _date(text: str) -> date | None:
    """A date as MIMIC-III writes it: "2144-12-03", or with a time as the Postgres build and pandas exports write
    CHARTDATE ("2144-12-03 00:00:00", read as its day; every note was refused as a bad date before)."""
    try:
        return datetime.strptime(text.strip(), DATE_FORMAT).date()
    except ValueError:
        found = _datetime(text)
        return found.date() if found is not None else None


def _datetime(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.strip(), DATETIME_FORMAT)
    except ValueError:
        return None
