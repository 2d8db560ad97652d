"""MIMIC-III CSVs in, ClinicalBERT readmission chunk datasets out: one pass over NOTEEVENTS for all tasks.

Writes, under `output_dir`:
- `<task>/train.csv`, `<task>/val.csv`, `<task>/test.csv` for each task ("discharge", "early-2",
  "early-3"), one row per chunk with columns ID (HADM_ID), TEXT, Label, SUBJECT_ID, CHUNK (index of
  the chunk within its admission); ID, TEXT and Label are the columns the original
  `run_readmission.py` reads. Training rows are shuffled; val and test rows are in admission order.
- `summary.json`: the inputs, seed and tasks, and the `Report`: every count and example row number.

As the original: all tasks share one patient split, so a patient's scores can be followed from
early notes to discharge; training chunks are balanced by adding reserve negative admissions of
training patients (the original added a hand-picked 400 for discharge and 500 for 3 days); the
early-N test set keeps only admissions with DURATION >= N days (not yet discharged at the cutoff);
val is not filtered. Deviations: the split is over admissions that have at least one selected note
(the original split all admissions, so one without notes could take a balanced slot); train and
val files are written for every early-N task too (the original trained and validated on 3 days
only and wrote just the 2-day test set).
"""
import csv
import json
import os
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from ..atomic import replaced_file, write_text
from .cohort import SPLITS, CohortAdmission, Splits, build_cohort, check_fractions, make_splits
from .mimic import Report, read_admissions, stream_notes
from .notes import SelectedNotes, admission_chunks, parse_task, select_notes

ReadmissionTask = Literal["discharge", "early-2", "early-3"]
TASKS = get_args(ReadmissionTask)
CHUNK_COLUMNS = ("ID", "TEXT", "Label", "SUBJECT_ID", "CHUNK")


def prepare(admissions_csv: str | os.PathLike, noteevents_csv: str | os.PathLike, output_dir: str | os.PathLike,
            tasks: tuple[str, ...] = TASKS, seed: int = 0,
            fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> Report:
    """Read, label, split, clean, chunk and write the readmission datasets; return what happened.

    `seed` fixes the split, the balancing draws and the training shuffle; `fractions` are the
    train/val/test shares of patients (see `make_splits`). Cohort admissions that no requested
    task has a note for are counted under "admissions_without_notes" and left out of the split.
    Raises ValueError for an unknown task,
    a missing input file or column (see `mimic`), bad `fractions`, and for inputs that leave no
    admission with notes.
    """
    tasks = tuple(tasks)
    if not tasks:
        raise ValueError(f"no tasks given; use some of {TASKS}")
    cutoffs = {task: parse_task(task) for task in tasks}  # fail on bad arguments before reading 4 GB
    check_fractions(fractions)
    report = Report()
    admissions = read_admissions(admissions_csv, report)
    cohort = build_cohort(admissions, report)
    selected = select_notes(stream_notes(noteevents_csv, report), cohort, admissions, tasks, report)

    with_notes = []
    for admission in cohort:
        if selected.has_notes(admission.hadm_id):
            with_notes.append(admission)
        else:
            report.problem("admissions_without_notes", admission.row)
    report.add("admissions_with_notes", len(with_notes))
    if not with_notes:
        raise ValueError(f"no admission of {admissions_csv} kept any note of {noteevents_csv} for tasks "
                         f"{list(tasks)}; check that the files belong together (counts: {report.counts})")
    splits = make_splits(with_notes, seed=seed, fractions=fractions)
    by_id = {admission.hadm_id: admission for admission in with_notes}

    output_dir = Path(output_dir)
    files = {}
    for task, cutoff in cutoffs.items():
        report.datasets[task] = {}
        for split in SPLITS:
            rows, stats = _split_rows(task, cutoff, split, splits, by_id, selected, seed)
            path = output_dir / task / f"{split}.csv"
            write_chunks(path, rows)
            files[f"{task}/{split}"] = str(path.relative_to(output_dir))
            report.datasets[task][split] = stats

    summary = {"inputs": {"admissions": str(admissions_csv), "noteevents": str(noteevents_csv)},
               "seed": seed, "tasks": list(tasks), "files": files, **report.to_dict()}
    write_text(output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return report


def write_chunks(path: str | os.PathLike, rows: list[dict]) -> int:
    """Write chunk rows (dicts with the CHUNK_COLUMNS keys) to a CSV file; return the row count."""
    with replaced_file(path) as temporary, open(temporary, "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=CHUNK_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def _split_rows(task: str, cutoff: int | None, split: str, splits: Splits, by_id: dict[int, CohortAdmission],
                selected: SelectedNotes, seed: int) -> tuple[list[dict], dict]:
    """The chunk rows of one task's split and their statistics."""
    stats = {"admissions_without_chunks": 0}
    admissions = [by_id[hadm_id] for hadm_id in splits[split]]
    if split == "test" and cutoff is not None:
        # Only admissions still in hospital at the cutoff are actionable (the original's rule).
        kept = [a for a in admissions if a.duration_days >= cutoff]
        stats["dropped_stays_shorter_than_cutoff"] = len(admissions) - len(kept)
        admissions = kept

    rows = []
    for admission in admissions:
        chunks = _admission_rows(admission, task, selected)
        stats["admissions_without_chunks"] += not chunks
        rows.extend(chunks)

    if split == "train":
        # Positive admissions have longer notes, so balance chunks (what the model trains on),
        # not only admissions, with negatives of training patients that balancing left out.
        negatives, positives = _count_labels(rows)
        added = 0
        for hadm_id in splits.train_reserve:
            if negatives >= positives:
                break
            extra = _admission_rows(by_id[hadm_id], task, selected)
            added += bool(extra)
            negatives += len(extra)
            rows.extend(extra)
        stats["reserve_negatives_added"] = added
        rows = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]

    negatives, positives = _count_labels(rows)
    ids = {row["ID"]: row["Label"] for row in rows}
    stats.update(admissions=len(ids), positive_admissions=sum(ids.values()),
                 negative_admissions=len(ids) - sum(ids.values()),
                 chunks=len(rows), positive_chunks=positives, negative_chunks=negatives)
    return rows, stats


def _admission_rows(admission: CohortAdmission, task: str, selected: SelectedNotes) -> list[dict]:
    return [{"ID": admission.hadm_id, "TEXT": chunk, "Label": admission.label,
             "SUBJECT_ID": admission.subject_id, "CHUNK": index}
            for index, chunk in enumerate(admission_chunks(selected.notes(admission.hadm_id, task)))]


def _count_labels(rows: list[dict]) -> tuple[int, int]:
    positives = sum(row["Label"] for row in rows)
    return len(rows) - positives, positives
