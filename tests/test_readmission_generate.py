"""Generated MIMIC-III-shaped data: exact schema, marked as generated, learnable but not trivial, bad rows counted."""
import csv
import re
import time
from collections import Counter, defaultdict

import numpy as np
import pytest

from bertforge.readmission import Report, build_cohort, generate_mimic, prepare, read_admissions, stream_notes

MARK = "GENERATED — not MIMIC-III data"
# The column lists of MIMIC-III v1.4.
ADMISSIONS_V14 = ["ROW_ID", "SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE",
                  "ADMISSION_LOCATION", "DISCHARGE_LOCATION", "INSURANCE", "LANGUAGE", "RELIGION", "MARITAL_STATUS",
                  "ETHNICITY", "EDREGTIME", "EDOUTTIME", "DIAGNOSIS", "HOSPITAL_EXPIRE_FLAG", "HAS_CHARTEVENTS_DATA"]
NOTEEVENTS_V14 = ["ROW_ID", "SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "STORETIME", "CATEGORY",
                  "DESCRIPTION", "CGID", "ISERROR", "TEXT"]
RISK = ["chf exacerbation", "noncompliance", "against medical advice", "without services", "lives alone"]
PROTECTIVE = ["supportive family", "visiting nurse", "back to baseline", "adherent", "fully resolved"]


def read_rows(path):
    with open(path, encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return generate_mimic(tmp_path_factory.mktemp("mimic"), n_patients=200, seed=0, inject_errors=True)


@pytest.fixture(scope="module")
def prepared(generated, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("prepared")
    started = time.perf_counter()
    report = prepare(generated.admissions, generated.noteevents, output_dir, seed=0)
    return report, output_dir, time.perf_counter() - started


def test_files_have_the_mimic_iii_columns_and_are_marked_generated(generated):
    for path, columns in ((generated.admissions, ADMISSIONS_V14), (generated.noteevents, NOTEEVENTS_V14)):
        assert "GENERATED" in path.name
        with open(path, encoding="utf-8", newline="") as file:
            assert next(csv.reader(file)) == columns
    assert "not MIMIC-III" in generated.readme.read_text(encoding="utf-8")
    assert all(row["DIAGNOSIS"].startswith("GENERATED: ") for row in read_rows(generated.admissions))
    assert all(row["TEXT"].startswith(MARK + "\n") for row in read_rows(generated.noteevents))


def test_admissions_and_notes_look_like_mimic(generated):
    admissions = read_rows(generated.admissions)
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
    assert all(stamp.fullmatch(row["DISCHTIME"]) for row in admissions)
    types = Counter(row["ADMISSION_TYPE"] for row in admissions)
    assert set(types) == {"EMERGENCY", "URGENT", "ELECTIVE", "NEWBORN"} and types["EMERGENCY"] > types["ELECTIVE"]
    deaths = [row for row in admissions if row["DEATHTIME"]]
    assert deaths and all(row["HOSPITAL_EXPIRE_FLAG"] == "1" for row in deaths)
    per_subject = Counter(row["SUBJECT_ID"] for row in admissions)
    assert set(per_subject.values()) == {1, 2, 3, 4}

    notes = read_rows(generated.noteevents)
    assert {"Nursing", "Physician ", "Radiology", "ECG", "Discharge summary"} <= {n["CATEGORY"] for n in notes}
    assert all(not n["CHARTTIME"] for n in notes if n["CATEGORY"] in ("ECG", "Discharge summary"))
    assert any(n["CHARTTIME"] for n in notes)
    summaries = [n["TEXT"] for n in notes if n["CATEGORY"] == "Discharge summary" and "Hospital Course" in n["TEXT"]]
    lengths = [len(text.split()) for text in summaries]
    assert 400 < np.median(lengths) < 1500 and max(lengths) < 2600
    sample = summaries[0]
    for section in ("Admission Date:", "History of Present Illness:", "Brief Hospital Course:",
                    "Discharge Medications:\n1. ", "Discharge Disposition:"):
        assert section in sample
    assert re.search(r"\[\*\*\d{4}-\d{1,2}-\d{1,2}\*\*\]", sample) and "[**Hospital1 18**]" in sample


def test_same_seed_same_files(tmp_path):
    first = generate_mimic(tmp_path / "a", n_patients=15, seed=7)
    second = generate_mimic(tmp_path / "b", n_patients=15, seed=7)
    assert first.noteevents.read_bytes() == second.noteevents.read_bytes()
    assert first.admissions.read_bytes() == second.admissions.read_bytes()
    assert generate_mimic(tmp_path / "c", n_patients=15, seed=8).admissions.read_bytes() != first.admissions.read_bytes()


def test_readmission_is_reasonably_common_and_learnable_but_not_trivially(generated):
    report = Report()
    cohort = build_cohort(read_admissions(generated.admissions, report), report)
    labels = {a.hadm_id: a.label for a in cohort}
    assert 0.1 < np.mean(list(labels.values())) < 0.3
    scores = defaultdict(int)
    for note in stream_notes(generated.noteevents, report):
        if note.category == "Discharge summary" and note.hadm_id in labels:
            text = note.text.lower()
            scores[note.hadm_id] = sum(p in text for p in RISK) - sum(p in text for p in PROTECTIVE)
    score = np.array([scores[h] for h in labels], dtype=float)
    label = np.array(list(labels.values()))
    # AUROC of a five-phrase score: the probability a positive outscores a negative, ties half.
    wins = (score[label == 1][:, None] > score[label == 0][None, :]).mean()
    ties = (score[label == 1][:, None] == score[label == 0][None, :]).mean()
    assert 0.6 < wins + ties / 2 < 0.92


def test_injected_bad_rows_are_counted(generated, prepared):
    report, _, _ = prepared
    assert generated.injected
    for key, count in generated.injected.items():
        assert report[key] == count, key
    assert report["notes_subject_mismatch"] == 0 and report["admissions_bad_id"] == 0


def test_prepare_accounts_for_every_row_and_writes_balanced_chunks(generated, prepared):
    report, output_dir, seconds = prepared
    assert seconds < 10, f"prepare took {seconds:.1f} s on 200 generated patients"
    counts = report.counts
    admission_outcomes = ("admissions_bad_date", "admissions_bad_id", "admissions_duplicate_hadm_id",
                          "admissions_dropped_newborn", "admissions_dropped_death", "cohort_admissions")
    assert counts["admissions_read"] == sum(report[k] for k in admission_outcomes)
    assert counts["cohort_admissions"] == counts["admissions_with_notes"] + counts["admissions_without_notes"]
    note_outcomes = [k for k in counts if k.startswith("notes_") and k != "notes_read"]
    assert counts["notes_read"] == sum(counts[k] for k in note_outcomes) and counts["notes_used"] > 0

    subjects_by_split, label_of = {}, {}
    for split in ("train", "val", "test"):
        rows = read_rows(output_dir / "discharge" / f"{split}.csv")
        assert rows and list(rows[0]) == ["ID", "TEXT", "Label", "SUBJECT_ID", "CHUNK"]
        assert all(10 < len(row["TEXT"].split()) <= 318 for row in rows)
        assert all(label_of.setdefault(row["ID"], row["Label"]) == row["Label"] for row in rows)
        assert not any("[**" in row["TEXT"] for row in rows)
        subjects_by_split[split] = {row["SUBJECT_ID"] for row in rows}
        stats = report.datasets["discharge"][split]
        assert stats["positive_admissions"] == stats["negative_admissions"] or split == "train"
    assert not subjects_by_split["train"] & (subjects_by_split["val"] | subjects_by_split["test"])
    assert not subjects_by_split["val"] & subjects_by_split["test"]
    train = report.datasets["discharge"]["train"]
    # Reserve negatives are added until negative chunks catch up with positive ones.
    assert train["negative_chunks"] >= train["positive_chunks"] or train["negative_admissions"] > train["positive_admissions"]
    assert abs(train["negative_chunks"] - train["positive_chunks"]) <= 0.1 * train["chunks"]


def test_prepare_repeats_with_the_seed(generated, prepared, tmp_path):
    _, output_dir, _ = prepared
    prepare(generated.admissions, generated.noteevents, tmp_path, tasks=("discharge",), seed=0)
    for split in ("train", "val", "test"):
        assert (tmp_path / "discharge" / f"{split}.csv").read_bytes() == \
            (output_dir / "discharge" / f"{split}.csv").read_bytes()
