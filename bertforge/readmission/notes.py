"""Pick the notes each readmission task reads, clean them and cut them into 318-word chunks.

As in kexinhuang12345/clinicalBERT `preprocess.py`:
- "discharge": the last 'Discharge summary' of each admission, by CHARTDATE and then file order
  (the original sorts by CHARTDATE and takes `nth(-1)`; repeated summaries are mostly addenda);
- "early-N": every note, of any category, whose CHARTDATE is less than N days after the calendar
  date of ADMITTIME, i.e. (CHARTDATE - ADMITTIME.date) < N days, so N=2 takes the admission day
  and the next; notes dated before admission count too. They are joined with spaces in
  CHARTDATE order (file order within a day) and cleaned after joining, as the original does.
  Like the original, this takes a discharge summary dated within the cutoff (short stays); the
  test set only keeps stays of at least N days, which `prepare` applies;
- `clean_text` is the original's `preprocessing` + `preprocess1`; `chunk_notes` is its chunker;
  `admission_chunks` is the two after joining, the one way an admission's notes become chunks
  (`prepare` writes them, `readmission score` scores them).

Deviation: notes are matched to admissions by HADM_ID and must agree on SUBJECT_ID (the
original merges on both, so the outcome is the same); notes with an unparseable CHARTDATE are
left out of every task (the original would keep one as the "last" discharge summary).
Memory: the selected notes are held until chunking, about 0.6 GB for the discharge summaries of
MIMIC-III and more for early notes, not the 4 GB of the whole file.
"""
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .cohort import CohortAdmission
from .mimic import Admission, Note, Report

DISCHARGE_SUMMARY = "Discharge summary"
CHUNK_WORDS = 318
MIN_TAIL_WORDS = 10
_BRACKETS = re.compile(r"\[(.*?)\]")  # de-identification, e.g. [**2151-7-16**], [**Hospital1 18**]
# Numbers followed by a full stop ("1.", "12.", and also the "3." of "3.5"): the original strips
# them because its sentence segmenter split on list numbering.
_NUMBERING = re.compile(r"[0-9]+\.")
_RULES = re.compile(r"--|__|==")
_WHITESPACE = re.compile(r"\s+")
_EARLY_TASK = re.compile(r"early-([1-9][0-9]*)")


def parse_task(task: str) -> int | None:
    """The cutoff in days of an "early-N" task, or None for "discharge".

    Raises ValueError for any other name.
    """
    if task == "discharge":
        return None
    match = _EARLY_TASK.fullmatch(task)
    if match is None:
        raise ValueError(f"unknown readmission task {task!r}; use 'discharge' or 'early-N' with N days "
                         "(the paper's tasks are 'early-2' and 'early-3')")
    return int(match.group(1))


def clean_text(text: str) -> str:
    """Lower-case a note and strip de-identification brackets, list numbers and rules, as ClinicalBERT."""
    text = text.replace("\n", " ").replace("\r", " ").strip().lower()
    text = _BRACKETS.sub("", text)
    text = _NUMBERING.sub("", text)
    text = text.replace("dr.", "doctor").replace("m.d.", "md")
    text = text.replace("admission date:", "").replace("discharge date:", "")
    text = _RULES.sub("", text)
    return _WHITESPACE.sub(" ", text).strip()


def chunk_notes(text: str, words: int = CHUNK_WORDS, min_tail: int = MIN_TAIL_WORDS) -> list[str]:
    """Cut a text into chunks of `words` words; the remainder is kept only if longer than `min_tail`.

    700 words give chunks of 318, 318 and 64 words; 640 give 318 and 318 (the 4-word tail is
    dropped). Raises ValueError for `words` < 1 or `min_tail` < 0.
    """
    if words < 1 or min_tail < 0:
        raise ValueError(f"chunk_notes needs words >= 1 and min_tail >= 0, got words={words}, min_tail={min_tail}")
    tokens = text.split()
    full = len(tokens) // words
    chunks = [" ".join(tokens[i * words:(i + 1) * words]) for i in range(full)]
    if len(tokens) % words > min_tail:
        chunks.append(" ".join(tokens[full * words:]))
    return chunks


def admission_chunks(notes: Sequence[str]) -> list[str]:
    """An admission's notes, in order, as its chunks: joined with spaces, cleaned, then cut by `chunk_notes`.

    The original's preprocessing of early notes (a discharge summary is one note). Joining before
    chunking matters: a note's tail of up to MIN_TAIL_WORDS words, or a short note, is not dropped
    but read with the next note's words.
    """
    return chunk_notes(clean_text(" ".join(notes)))


@dataclass
class SelectedNotes:
    """The notes kept for the tasks: the last discharge summary and the early notes of each admission.

    `early` holds (days after the admission date, note) for notes within the largest cutoff.
    """
    discharge: dict[int, Note] = field(default_factory=dict)
    early: dict[int, list[tuple[int, Note]]] = field(default_factory=dict)

    def notes(self, hadm_id: int, task: str) -> list[str]:
        """The texts of the notes an admission gives a task, in order ([] when it has none): the last
        discharge summary, or the early notes by CHARTDATE and then file order."""
        cutoff = parse_task(task)
        if cutoff is None:
            note = self.discharge.get(hadm_id)
            return [] if note is None else [note.text]
        notes = sorted(((note.chart_date, note.row), note.text) for days, note in self.early.get(hadm_id, ())
                       if days < cutoff)
        return [text for _, text in notes]

    def has_notes(self, hadm_id: int) -> bool:
        return hadm_id in self.discharge or hadm_id in self.early


def select_notes(notes: Iterable[Note], cohort: Iterable[CohortAdmission], admissions: Iterable[Admission],
                 tasks: Iterable[str], report: Report) -> SelectedNotes:
    """Keep, from a stream of notes, only what `tasks` read for the admissions of `cohort`.

    `admissions` are all usable ADMISSIONS rows, to tell a note of a dropped admission (newborn,
    death) from one whose HADM_ID is unknown. Every note is counted once in `report`:
    "notes_unknown_hadm_id", "notes_subject_mismatch", "notes_excluded_admission",
    "notes_empty" (no text: left out, so an empty later summary does not replace the real one), "notes_used" (read
    by at least one task) or "notes_not_used" (a later note, an earlier discharge summary that a later one replaced,
    or a category no task reads).
    Raises ValueError for an unknown task name.
    """
    cutoffs = [parse_task(task) for task in tasks]
    wants_discharge = None in cutoffs
    longest_cutoff = max((c for c in cutoffs if c is not None), default=None)
    subjects = {a.hadm_id: a.subject_id for a in admissions}
    admit_dates = {a.hadm_id: a.admit_time.date() for a in cohort}

    selected = SelectedNotes()
    in_cohort = empty = 0
    for note in notes:
        subject = subjects.get(note.hadm_id)
        if subject is None:
            report.problem("notes_unknown_hadm_id", note.row)
            continue
        if subject != note.subject_id:
            report.problem("notes_subject_mismatch", note.row)
            continue
        admit_date = admit_dates.get(note.hadm_id)
        if admit_date is None:
            report.add("notes_excluded_admission")
            continue
        in_cohort += 1
        if not note.text.strip():  # nothing to read: an empty summary replaced the real one and lost its admission
            empty += 1
            continue
        if wants_discharge and note.category == DISCHARGE_SUMMARY:
            kept = selected.discharge.get(note.hadm_id)
            if kept is None or (note.chart_date, note.row) >= (kept.chart_date, kept.row):
                selected.discharge[note.hadm_id] = note
        days = (note.chart_date - admit_date).days
        if longest_cutoff is not None and days < longest_cutoff:
            selected.early.setdefault(note.hadm_id, []).append((days, note))

    used = {note.row for note in selected.discharge.values()}
    used.update(note.row for notes in selected.early.values() for _, note in notes)
    report.add("notes_used", len(used))
    if empty:
        report.add("notes_empty", empty)
    report.add("notes_not_used", in_cohort - empty - len(used))
    return selected
