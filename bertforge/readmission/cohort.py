"""Label admissions for 30-day readmission and split them by patient, as ClinicalBERT does.

The rules follow kexinhuang12345/clinicalBERT `preprocess.py`:
- admissions are ordered per patient by ADMITTIME; an admission's next admission is the next one
  that is not ELECTIVE (the original blanks elective next admissions and back-fills, which comes
  to the same thing); DAYS_NEXT_ADMIT = (next ADMITTIME - DISCHTIME) in days; the label is 1 when
  DAYS_NEXT_ADMIT < 30, which includes negative gaps (overlapping stays), and 0 when there is no
  next admission;
- labels are computed on all admissions first, then NEWBORN admissions and admissions with a
  DEATHTIME (in-hospital deaths) are dropped, in that order, so a newborn that died counts as
  newborn; DURATION = (DISCHTIME - ADMITTIME) in days is kept for the early-notes test filter.
- the split balances positives and negatives at admission level in every split (the original
  draws as many negative admissions as there are positives, then takes 20% of each for val+test
  and halves that), and keeps the unchosen negatives of the training patients in reserve, which
  `prepare` draws from to balance training chunks (the original adds a hand-picked 400 or 500).

Deviations: the split is by patient (SUBJECT_ID), so no patient is in two splits (the original
splits admissions, and its extra training negatives can come from any patient); ties in
ADMITTIME keep file order (pandas' sort made no promise); admissions with an unparseable date
are left out before labelling (the original keeps them as NaT, which sorts last).
"""
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from .mimic import Admission, Report

SPLITS = ("train", "val", "test")
READMISSION_DAYS = 30
_SECONDS_PER_DAY = 24 * 60 * 60


@dataclass(frozen=True)
class CohortAdmission:
    """A labelled admission; `days_next_admit` is None when no non-elective admission follows."""
    subject_id: int
    hadm_id: int
    admit_time: datetime
    discharge_time: datetime
    days_next_admit: float | None
    label: int
    duration_days: float
    row: int


@dataclass(frozen=True)
class Splits:
    """HADM_IDs per split (sorted), and the training negatives left out by balancing, in random order."""
    train: tuple[int, ...]
    val: tuple[int, ...]
    test: tuple[int, ...]
    train_reserve: tuple[int, ...] = ()

    def __getitem__(self, split: str) -> tuple[int, ...]:
        if split not in SPLITS:
            raise KeyError(f"unknown split {split!r}; use one of {SPLITS}")
        return getattr(self, split)


def build_cohort(admissions: Iterable[Admission], report: Report) -> list[CohortAdmission]:
    """Label every admission, then drop newborns and in-hospital deaths; file order is kept.

    Counts "admissions_dropped_newborn", "admissions_dropped_death", "cohort_admissions",
    "cohort_positives" and "cohort_negatives" in `report`.
    """
    admissions = list(admissions)
    by_subject = defaultdict(list)
    for admission in admissions:
        by_subject[admission.subject_id].append(admission)

    days_next_admit = {}
    for stays in by_subject.values():
        stays.sort(key=lambda a: a.admit_time)  # stable: equal times keep file order
        next_admit_time = None
        # Walking backwards, `next_admit_time` is the ADMITTIME of the nearest later
        # non-elective admission: the original's "blank ELECTIVE, then back-fill".
        for admission in reversed(stays):
            days_next_admit[admission.hadm_id] = (
                None if next_admit_time is None
                else (next_admit_time - admission.discharge_time).total_seconds() / _SECONDS_PER_DAY)
            if admission.admission_type != "ELECTIVE":
                next_admit_time = admission.admit_time

    cohort = []
    for admission in admissions:
        if admission.admission_type == "NEWBORN":
            report.add("admissions_dropped_newborn")
            continue
        if admission.death_time is not None:
            report.add("admissions_dropped_death")
            continue
        days = days_next_admit[admission.hadm_id]
        label = int(days is not None and days < READMISSION_DAYS)
        duration = (admission.discharge_time - admission.admit_time).total_seconds() / _SECONDS_PER_DAY
        cohort.append(CohortAdmission(admission.subject_id, admission.hadm_id, admission.admit_time,
                                      admission.discharge_time, days, label, duration, admission.row))
    report.add("cohort_admissions", len(cohort))
    report.add("cohort_positives", sum(a.label for a in cohort))
    report.add("cohort_negatives", sum(1 - a.label for a in cohort))
    return cohort


def check_fractions(fractions: tuple[float, float, float]) -> tuple[float, float, float]:
    """The train/val/test fractions as floats; ValueError unless three non-negative numbers summing to 1."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"fractions must be three non-negative numbers (train, val, test) summing to 1, "
                         f"got {fractions}")
    return fractions


def make_splits(cohort: Iterable[CohortAdmission], seed: int = 0,
                fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), balance: bool = True) -> Splits:
    """Split admissions into train/val/test by patient; the same seed gives the same split.

    Patients with a positive admission and the others are shuffled separately and cut at
    `fractions` (of positives, and of admissions, respectively), so each split gets about its
    share of positives. With `balance`, each split keeps all its positives and as many randomly
    drawn negatives (all negatives if there are fewer); the training negatives not drawn go to
    `train_reserve`. Raises ValueError for `fractions` that are not three non-negative numbers
    summing to 1.
    """
    fractions = check_fractions(fractions)
    rng = np.random.default_rng(seed)
    by_subject = defaultdict(list)
    for admission in cohort:
        by_subject[admission.subject_id].append(admission)

    members = {split: [] for split in SPLITS}
    with_positive = sorted(s for s, stays in by_subject.items() if any(a.label for a in stays))
    without_positive = sorted(s for s, stays in by_subject.items() if not any(a.label for a in stays))
    for subjects, weight in ((with_positive, lambda stays: sum(a.label for a in stays)), (without_positive, len)):
        subjects = [subjects[i] for i in rng.permutation(len(subjects))]
        weights = np.array([weight(by_subject[s]) for s in subjects], dtype=float)
        cut_points = np.cumsum(fractions) * weights.sum()
        # A patient goes where the middle of its weight falls, so cuts land between patients.
        middles = np.cumsum(weights) - weights / 2
        for subject, middle in zip(subjects, middles):
            index = min(int(np.searchsorted(cut_points, middle, side="right")), len(SPLITS) - 1)
            members[SPLITS[index]].extend(by_subject[subject])

    chosen, reserve = {}, ()
    for split in SPLITS:
        positives = sorted(a.hadm_id for a in members[split] if a.label)
        negatives = sorted(a.hadm_id for a in members[split] if not a.label)
        if balance:
            order = [negatives[i] for i in rng.permutation(len(negatives))]
            negatives, left_out = order[:len(positives)], order[len(positives):]
            if split == "train":
                reserve = tuple(left_out)
        chosen[split] = tuple(sorted(positives + negatives))
    return Splits(chosen["train"], chosen["val"], chosen["test"], reserve)
