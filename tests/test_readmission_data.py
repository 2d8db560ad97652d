"""Readmission data as ClinicalBERT prepares it: labels, note selection, cleaning, chunks, splits, bad input.

Every case is a tiny ADMISSIONS/NOTEEVENTS pair written by hand, with the expected answer worked out
from the rules of kexinhuang12345/clinicalBERT `preprocess.py`.
"""
import csv
import json
import types
from datetime import datetime

import numpy as np
import pytest

from bertforge.readmission import (
    CohortAdmission,
    Report,
    build_cohort,
    chunk_notes,
    clean_text,
    make_splits,
    parse_task,
    prepare,
    read_admissions,
    select_notes,
    stream_notes,
)

ADMISSION_COLUMNS = ["SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE"]
NOTE_COLUMNS = ["ROW_ID", "SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "CATEGORY", "TEXT"]


def write_csv(path, columns, rows):
    with open(path, "w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(rows)
    return path


def words(prefix, n=20):
    return " ".join(f"{prefix}{i}" for i in range(n))


def cohort_of(tmp_path, rows):
    report = Report()
    admissions = read_admissions(write_csv(tmp_path / "ADMISSIONS.csv", ADMISSION_COLUMNS, rows), report)
    return {a.hadm_id: a for a in build_cohort(admissions, report)}, admissions, report


# ---------------------------------------------------------------- labels

def test_labels_follow_the_next_non_elective_admission(tmp_path):
    rows = [
        # Subject 1: the elective stay 5 days later is skipped; the next non-elective one is 55 days on.
        (1, 101, "2100-01-01 08:00:00", "2100-01-05 08:00:00", "", "EMERGENCY"),
        (1, 102, "2100-01-10 08:00:00", "2100-01-12 08:00:00", "", "ELECTIVE"),
        (1, 103, "2100-03-01 08:00:00", "2100-03-04 08:00:00", "", "EMERGENCY"),
        # Subject 2, written out of order: 29.9 days → positive; 30.1 days → negative.
        (2, 203, "2100-03-08 02:24:00", "2100-03-10 00:00:00", "", "EMERGENCY"),
        (2, 202, "2100-02-03 21:36:00", "2100-02-06 00:00:00", "", "URGENT"),
        (2, 201, "2100-01-01 00:00:00", "2100-01-05 00:00:00", "", "EMERGENCY"),
        # A newborn, and a readmission that ends in death: both dropped, the death still
        # makes the stay before it a positive, as in the original (labels come first).
        (3, 301, "2100-01-01 00:00:00", "2100-01-03 00:00:00", "", "NEWBORN"),
        (4, 401, "2100-01-01 00:00:00", "2100-01-03 00:00:00", "", "EMERGENCY"),
        (4, 402, "2100-01-13 00:00:00", "2100-01-20 00:00:00", "2100-01-20 00:00:00", "EMERGENCY"),
    ]
    cohort, _, report = cohort_of(tmp_path, rows)
    assert {h: a.label for h, a in cohort.items()} == {101: 0, 102: 0, 103: 0, 201: 1, 202: 0, 203: 0, 401: 1}
    assert cohort[101].days_next_admit == pytest.approx(55.0)
    assert cohort[102].days_next_admit == pytest.approx(48.0)
    assert cohort[201].days_next_admit == pytest.approx(29.9)
    assert cohort[202].days_next_admit == pytest.approx(30.1)
    assert cohort[103].days_next_admit is None and cohort[203].days_next_admit is None
    assert cohort[201].duration_days == pytest.approx(4.0)
    assert (report["admissions_read"], report["admissions_dropped_newborn"], report["admissions_dropped_death"]) == (9, 1, 1)
    assert (report["cohort_admissions"], report["cohort_positives"], report["cohort_negatives"]) == (7, 2, 5)


def test_only_elective_admissions_after_gives_no_next_admission(tmp_path):
    cohort, _, _ = cohort_of(tmp_path, [(1, 1, "2100-01-01 00:00:00", "2100-01-02 00:00:00", "", "EMERGENCY"),
                                        (1, 2, "2100-01-03 00:00:00", "2100-01-04 00:00:00", "", "ELECTIVE")])
    assert cohort[1].label == 0 and cohort[1].days_next_admit is None


# ---------------------------------------------------------------- note selection

ADMISSIONS = [
    (1, 101, "2100-05-01 23:00:00", "2100-05-06 10:00:00", "", "EMERGENCY"),
    (1, 102, "2100-05-20 10:00:00", "2100-05-25 10:00:00", "", "EMERGENCY"),
    (2, 201, "2100-01-01 10:00:00", "2100-01-05 10:00:00", "", "URGENT"),
    (3, 301, "2100-01-01 10:00:00", "2100-01-03 10:00:00", "", "NEWBORN"),
]


def select(tmp_path, notes, tasks=("discharge", "early-2", "early-3")):
    report = Report()
    admissions = read_admissions(write_csv(tmp_path / "ADMISSIONS.csv", ADMISSION_COLUMNS, ADMISSIONS), report)
    cohort = build_cohort(admissions, report)
    note_path = write_csv(tmp_path / "NOTEEVENTS.csv", NOTE_COLUMNS, notes)
    return select_notes(stream_notes(note_path, report), cohort, admissions, tasks, report), report


def test_the_last_discharge_summary_is_chosen(tmp_path):
    notes = [
        (1, 1, 101, "2100-05-06", "", "Discharge summary", "first summary"),
        (2, 1, 101, "2100-05-06", "", "Discharge summary", "addendum written later"),
        (3, 2, 201, "2100-01-06", "", "Discharge summary", "final summary"),  # later date, earlier row
        (4, 2, 201, "2100-01-05", "", "Discharge summary", "draft summary"),
        (5, 1, 102, "2100-05-21", "", "Nursing", "no summary for this stay"),
    ]
    selected, _ = select(tmp_path, notes, tasks=("discharge",))
    assert selected.notes(101, "discharge") == ["addendum written later"]
    assert selected.notes(201, "discharge") == ["final summary"]
    assert selected.notes(102, "discharge") == []


def test_early_notes_use_whole_days_since_the_admission_date(tmp_path):
    # Admitted at 23:00 on 05-01: a note on 05-03 is only a day later, but it is day 2 of the
    # admission date, so early-3 takes it and early-2 does not ((CHARTDATE - ADMITTIME.date) < N).
    notes = [
        (1, 1, 101, "2100-05-03", "2100-05-03 01:00:00", "Nursing", "charlie"),
        (2, 1, 101, "2100-05-01", "2100-05-01 23:30:00", "Nursing", "alpha"),
        (3, 1, 101, "2100-05-04", "", "ECG", "delta"),
        (4, 1, 101, "2100-05-02", "", "Physician ", "Bravo"),
        (5, 1, 101, "2100-04-30", "", "Radiology", "zulu"),  # dated before admission: kept, as the original
        (6, 1, 101, "2100-05-02", "", "Discharge summary", "echo"),  # any category counts
    ]
    selected, _ = select(tmp_path, notes)
    assert selected.notes(101, "early-2") == ["zulu", "alpha", "Bravo", "echo"]
    assert selected.notes(101, "early-3") == ["zulu", "alpha", "Bravo", "echo", "charlie"]
    assert selected.notes(101, "early-1") == ["zulu", "alpha"]
    assert selected.notes(201, "early-3") == []


def test_every_note_is_counted_once(tmp_path):
    notes = [
        (1, 1, 101, "2100-05-01", "", "Nursing", "used early"),
        (2, 1, 101, "2100-05-06", "", "Nursing", "too late for early notes"),
        (3, 1, 999, "2100-05-01", "", "Nursing", "unknown admission"),
        (4, 1, "", "2100-05-01", "", "ECG", "outpatient"),
        (5, 1, 101, "05/01/2100", "", "Nursing", "bad date"),
        (6, 2, 101, "2100-05-01", "", "Nursing", "wrong patient"),
        (7, 3, 301, "2100-01-01", "", "Nursing", "newborn"),
        (8, "x", 101, "2100-05-01", "", "Nursing", "bad id"),
        (9, 2, 201, "2100-01-04", "", "Discharge summary", "used discharge"),
    ]
    _, report = select(tmp_path, notes)
    expected = {"notes_read": 9, "notes_used": 2, "notes_not_used": 1, "notes_unknown_hadm_id": 1,
                "notes_without_hadm_id": 1, "notes_bad_date": 1, "notes_subject_mismatch": 1,
                "notes_excluded_admission": 1, "notes_bad_id": 1}
    assert {k: v for k, v in report.counts.items() if k.startswith("notes_")} == expected
    assert report.examples["notes_unknown_hadm_id"] == [3] and report.examples["notes_bad_date"] == [5]


def test_notes_are_streamed_and_multi_line_text_survives(tmp_path):
    text = 'Line one, with "quotes".\n\nLine two\r\nend'
    path = write_csv(tmp_path / "NOTEEVENTS.csv", NOTE_COLUMNS, [(1, 1, 101, "2100-05-01", "", "Nursing", text)] * 2)
    notes = stream_notes(path, Report())
    assert isinstance(notes, types.GeneratorType)
    assert [note.text for note in notes] == [text, text]


# ---------------------------------------------------------------- bad input

def test_missing_columns_name_the_file_and_what_was_found(tmp_path):
    path = write_csv(tmp_path / "ADMISSIONS.csv", ["SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "ADMISSION_TYPE"], [])
    with pytest.raises(ValueError, match=r"ADMISSIONS.csv: missing columns \['DEATHTIME'\]; found \['SUBJECT_ID'"):
        read_admissions(path, Report())
    path = write_csv(tmp_path / "NOTEEVENTS.csv", ["subject_id", "hadm_id", "chartdate", "category", "text"], [])
    with pytest.raises(ValueError, match=r"NOTEEVENTS.csv: missing columns \['CHARTTIME'\]"):
        list(stream_notes(path, Report()))  # lower-case names are fine (the Postgres build)
    with pytest.raises(ValueError, match="nope.csv does not exist"):
        read_admissions(tmp_path / "nope.csv", Report())


def test_bad_admission_rows_are_counted_not_fatal(tmp_path):
    rows = [(1, 1, "2100-01-01 00:00:00", "2100-01-02 00:00:00", "", "EMERGENCY"),
            (1, 2, "2100-13-01 00:00:00", "2100-01-02 00:00:00", "", "EMERGENCY"),
            (1, 3, "2100-01-01 00:00:00", "2100-01-02 00:00:00", "yesterday", "EMERGENCY"),
            (1, "", "2100-01-01 00:00:00", "2100-01-02 00:00:00", "", "EMERGENCY"),
            (1, 1, "2100-01-01 00:00:00", "2100-01-02 00:00:00", "", "EMERGENCY")]
    report = Report()
    admissions = read_admissions(write_csv(tmp_path / "A.csv", ADMISSION_COLUMNS, rows), report)
    assert [a.hadm_id for a in admissions] == [1]
    assert report.counts == {"admissions_read": 5, "admissions_bad_date": 2, "admissions_bad_id": 1,
                             "admissions_duplicate_hadm_id": 1}
    assert report.examples["admissions_bad_date"] == [2, 3]


def test_unknown_task_and_bad_fractions_fail_before_reading(tmp_path):
    with pytest.raises(ValueError, match="unknown readmission task 'early-x'"):
        prepare(tmp_path / "a.csv", tmp_path / "n.csv", tmp_path / "out", tasks=("early-x",))
    with pytest.raises(ValueError, match="fractions must be three non-negative numbers"):
        prepare(tmp_path / "a.csv", tmp_path / "n.csv", tmp_path / "out", fractions=(0.5, 0.5, 0.5))
    assert parse_task("discharge") is None and parse_task("early-3") == 3


# ---------------------------------------------------------------- cleaning and chunks

def test_clean_text_as_preprocess1():
    note = ("Admission Date:  [**2151-7-16**]  Discharge Date: [**2151-7-22**]\nDischarge Medications:\n"
            "1. Aspirin 81 mg\n2. Furosemide 40 mg\r\nSeen by Dr. [**Last Name (NamePattern1) **], M.D. -- stable "
            "==== \nTemp 98.6")
    # "98.6" loses "98." too: the original's list-number rule does not look at context.
    assert clean_text(note) == "discharge medications: aspirin 81 mg furosemide 40 mg seen by doctor , md stable temp 6"


@pytest.mark.parametrize("n_words, sizes", [(700, [318, 318, 64]), (640, [318, 318]), (329, [318, 11]),
                                            (328, [318]), (10, []), (11, [11]), (0, [])])
def test_chunks_of_318_words_keep_a_tail_over_10(n_words, sizes):
    text = words("w", n_words)
    chunks = chunk_notes(text)
    assert [len(chunk.split()) for chunk in chunks] == sizes
    assert " ".join(chunks).split() == text.split()[:sum(sizes)]


def test_chunk_notes_rejects_bad_sizes():
    with pytest.raises(ValueError, match="words >= 1"):
        chunk_notes("a b c", words=0)


# ---------------------------------------------------------------- splits

def synthetic_cohort(n_subjects=400, seed=1):
    rng = np.random.default_rng(seed)
    cohort, hadm_id = [], 0
    for subject in range(n_subjects):
        for _ in range(int(rng.integers(1, 4))):
            hadm_id += 1
            label = int(rng.random() < 0.2)
            cohort.append(CohortAdmission(subject, hadm_id, datetime(2100, 1, 1), datetime(2100, 1, 3),
                                          10.0 if label else None, label, 2.0, hadm_id))
    return cohort


def test_splits_keep_patients_apart_and_balance_each_split():
    cohort = synthetic_cohort()
    by_id = {a.hadm_id: a for a in cohort}
    splits = make_splits(cohort, seed=0)
    subjects = {name: {by_id[h].subject_id for h in splits[name]} for name in ("train", "val", "test")}
    assert not subjects["train"] & subjects["val"] and not subjects["train"] & subjects["test"]
    assert not subjects["val"] & subjects["test"]
    positives = sum(a.label for a in cohort)
    for name, share in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
        labels = [by_id[h].label for h in splits[name]]
        assert sum(labels) == len(labels) - sum(labels)  # as many negatives as positives
        assert abs(sum(labels) - share * positives) <= 0.03 * positives + 2
    # The reserve: the training patients' negatives that balancing left out, and nothing else.
    reserve = set(splits.train_reserve)
    assert reserve and not reserve & set(splits.train) and all(by_id[h].label == 0 for h in reserve)
    train_patients = subjects["train"] | {by_id[h].subject_id for h in reserve}
    assert not train_patients & (subjects["val"] | subjects["test"])
    assert len(reserve) + len(splits.train) == sum(a.subject_id in train_patients for a in cohort)


def test_splits_repeat_with_the_seed_and_change_without_it():
    cohort = synthetic_cohort()
    assert make_splits(cohort, seed=3) == make_splits(list(reversed(cohort)), seed=3)
    assert make_splits(cohort, seed=3).test != make_splits(cohort, seed=4).test


def test_unbalanced_splits_use_every_admission_once():
    cohort = synthetic_cohort(50)
    splits = make_splits(cohort, seed=0, fractions=(0.6, 0.2, 0.2), balance=False)
    assert sorted(splits.train + splits.val + splits.test) == sorted(a.hadm_id for a in cohort)
    assert splits.train_reserve == ()
    with pytest.raises(ValueError, match="summing to 1"):
        make_splits(cohort, fractions=(0.8, 0.1))


# ---------------------------------------------------------------- prepare end to end

def test_prepare_filters_early_test_stays_and_writes_chunks(tmp_path):
    admissions = [
        (10, 1001, "2100-01-01 10:00:00", "2100-01-02 12:00:00", "", "EMERGENCY"),  # 1.08 days, positive
        (10, 1002, "2100-01-10 10:00:00", "2100-01-14 10:00:00", "", "EMERGENCY"),  # 4 days
        (11, 1101, "2100-03-01 10:00:00", "2100-03-03 11:00:00", "", "EMERGENCY"),  # 2.04 days, positive
        (11, 1102, "2100-03-20 10:00:00", "2100-03-22 10:00:00", "", "EMERGENCY"),  # exactly 2 days
        (12, 1201, "2100-03-20 10:00:00", "2100-03-22 10:00:00", "", "EMERGENCY"),  # no notes
    ]
    notes = [(i, hadm // 100, hadm, day, "", category, words(f"h{hadm}d{day[-1]}", 30))
             for i, (hadm, day, category) in enumerate([
                 (1001, "2100-01-01", "Nursing"), (1001, "2100-01-02", "Discharge summary"),
                 (1002, "2100-01-10", "Nursing"), (1002, "2100-01-14", "Discharge summary"),
                 (1101, "2100-03-01", "Nursing"), (1101, "2100-03-03", "Discharge summary"),
                 (1102, "2100-03-20", "Nursing"), (1102, "2100-03-22", "Discharge summary")], start=1)]
    report = prepare(write_csv(tmp_path / "ADMISSIONS.csv", ADMISSION_COLUMNS, admissions),
                     write_csv(tmp_path / "NOTEEVENTS.csv", NOTE_COLUMNS, notes), tmp_path / "out",
                     fractions=(0, 0, 1))

    def test_rows(task):
        with open(tmp_path / "out" / task / "test.csv", encoding="utf-8", newline="") as file:
            return list(csv.DictReader(file))

    rows = test_rows("discharge")
    assert list(rows[0]) == ["ID", "TEXT", "Label", "SUBJECT_ID", "CHUNK"]
    assert {(r["ID"], r["Label"], r["SUBJECT_ID"]) for r in rows} == {
        ("1001", "1", "10"), ("1002", "0", "10"), ("1101", "1", "11"), ("1102", "0", "11")}
    assert rows[0]["TEXT"] == words("h1001d2", 30) and rows[0]["CHUNK"] == "0"
    # Test sets keep stays of at least N days: 1101 (2.04) and 1102 (2.0) for 2 days, 1002 for 3.
    assert sorted(r["ID"] for r in test_rows("early-2")) == ["1002", "1101", "1102"]
    assert [r["ID"] for r in test_rows("early-3")] == ["1002"]
    assert report.datasets["early-3"]["test"]["dropped_stays_shorter_than_cutoff"] == 3
    assert report["admissions_without_notes"] == 1 and report.examples["admissions_without_notes"] == [5]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["counts"] == report.counts and summary["tasks"] == ["discharge", "early-2", "early-3"]
    assert summary["files"]["early-3/test"] == "early-3/test.csv"


def test_an_empty_later_summary_does_not_replace_the_real_one(tmp_path):
    """An empty discharge summary dated after the real one replaced it, and the admission left the discharge task
    with no line saying why (counted as a note used)."""
    notes = [
        (1, 1, 101, "2100-05-06", "", "Discharge summary", "the real summary"),
        (2, 1, 101, "2100-05-07", "", "Discharge summary", "   "),
    ]
    selected, report = select(tmp_path, notes, tasks=("discharge",))
    assert selected.notes(101, "discharge") == ["the real summary"]
    assert (report["notes_empty"], report["notes_used"], report["notes_not_used"]) == (1, 1, 0)


def test_chart_dates_with_a_time_read_as_their_day(tmp_path):
    """MIMIC-III's Postgres build and pandas exports write CHARTDATE as "2100-05-03 00:00:00": every note was
    refused as a bad date, and prepare stopped saying the files did not belong together."""
    notes = [(1, 1, 101, "2100-05-01 00:00:00", "", "Nursing", "alpha"),
             (2, 1, 101, "2100-05-02 00:00:00", "", "Physician ", "bravo"),
             (3, 1, 101, "2100-05-06 00:00:00", "", "Discharge summary", "the summary")]
    selected, report = select(tmp_path, notes)
    assert selected.notes(101, "early-2") == ["alpha", "bravo"]
    assert selected.notes(101, "discharge") == ["the summary"] and report["notes_bad_date"] == 0
