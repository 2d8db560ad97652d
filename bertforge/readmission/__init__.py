"""30-day readmission from MIMIC-III notes, as ClinicalBERT (Huang et al., 2019) prepares it.

mimic.py reads ADMISSIONS and streams NOTEEVENTS; cohort.py labels admissions and splits them by
patient; notes.py cleans, selects and chunks the notes of each task; prepare.py wires them and
writes the chunk datasets; generate.py writes MIMIC-III-shaped CSVs that are not MIMIC-III data.
Only the standard library and numpy are imported here.
"""
from .cohort import CohortAdmission, Splits, build_cohort, make_splits
from .generate import GeneratedFiles, generate_mimic
from .mimic import Admission, Note, Report, read_admissions, stream_notes
from .notes import SelectedNotes, admission_chunks, chunk_notes, clean_text, parse_task, select_notes
from .prepare import prepare, write_chunks

__all__ = [
    "read_admissions", "stream_notes", "Admission", "Note", "Report",
    "build_cohort", "make_splits", "CohortAdmission", "Splits",
    "clean_text", "chunk_notes", "admission_chunks", "parse_task", "select_notes", "SelectedNotes",
    "prepare", "write_chunks",
    "generate_mimic", "GeneratedFiles",
]
