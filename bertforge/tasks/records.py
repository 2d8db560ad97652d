"""Write prediction records as CSV or JSON Lines (picked by the output file's suffix), atomically."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from ..atomic import replaced_file
from ..errors import UsageError


def write_records(records: list[dict], path: str | os.PathLike) -> Path:
    """Write dict rows to .csv/.tsv (columns from the first row) or .jsonl; a temp file is renamed in place.

    Raises ValueError for another suffix.
    """
    path = Path(path)
    if path.suffix not in (".csv", ".tsv", ".jsonl"):
        raise UsageError(f"cannot write predictions to {path}: use a .csv, .tsv or .jsonl file name")
    with replaced_file(path) as temporary, open(temporary, "w", encoding="utf-8", newline="") as file:
        if path.suffix == ".jsonl":
            for record in records:
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            columns = list(records[0]) if records else []
            writer = csv.DictWriter(file, columns, delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows({k: _cell(v) for k, v in record.items()} for record in records)
    return path


def _cell(value):
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else value
