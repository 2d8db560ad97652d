"""Read sentence-encoder data: training pairs, triplets or scored pairs; retrieval sets (BEIR layout).

Training files are .csv, .tsv or .jsonl (a header / JSON keys name the columns):
- pairs (anchor, positive) and triplets (anchor, positive, negative) for in-batch negatives;
- scored pairs (sentence1, sentence2, score) for CoSENT / cosine losses and Spearman.
A retrieval set is BEIR's layout: queries.jsonl and corpus.jsonl ({"_id", "text"} per line,
corpus "title" prepended when present) and a qrels .tsv (query-id, corpus-id, score; score > 0
is relevant, and nDCG's gain: `read_qrels`). Every problem with a file is one ValueError naming the file and the fix.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ...atomic import replaced_file
from ...input_files import DELIMITERS, corpus_record, jsonl_objects, open_table, require_file, text_suffix, titled
from ..classification.reader import JSONL_SUFFIX, read_rows, table_columns
from .metrics import graded

logger = logging.getLogger("bertforge")

PAIR_COLUMNS = ["anchor", "positive"]
TRIPLET_COLUMNS = ["anchor", "positive", "negative"]
SCORED_COLUMNS = ["sentence1", "sentence2", "score"]


@dataclass
class SentencePairs:
    """Rows of a training or evaluation file: the two sides, optional hard negatives or gold scores."""

    anchors: list[str]
    positives: list[str]
    negatives: list[str] | None = None
    scores: list[float] | None = None

    def __len__(self) -> int:
        return len(self.anchors)


def file_columns(path: Path) -> list[str]:
    """The column names of a CSV/TSV header or of the first JSONL object; [] for an empty file."""
    suffix = text_suffix(path).lower()  # a.tsv.gz is a TSV file
    if suffix == JSONL_SUFFIX:
        for _, record in jsonl_objects(path):
            return list(record)
        return []
    return table_columns(path)


def read_pairs(path: str | os.PathLike, columns: list[str] | None = None, scored: bool = False,
               held_out: bool = False) -> SentencePairs:
    """Pairs/triplets (scored=False) or scored pairs (scored=True) from a .csv, .tsv or .jsonl file.

    columns: the file's names for anchor, positive [, negative] (default anchor, positive, and
    negative when the file has it), or for sentence1, sentence2, score (default those).
    held_out: the file is dev/test data (scored pairs under their own names), which is what a
    missing column's message then advises.
    Raises ValueError for a missing or empty file, missing columns (a pair file where scored
    pairs are expected is named as such), a score that is not a number, or no usable rows.
    """
    path = require_file(path, "data file")
    if text_suffix(path).lower() not in (*DELIMITERS, JSONL_SUFFIX):
        raise ValueError(f"{path}: unknown format {text_suffix(path)!r}; use .csv, .tsv or .jsonl (optionally .gz / .xz)")
    found = file_columns(path)
    if not found:
        raise ValueError(f"{path} is empty; it needs a header row (or JSON keys) and at least one row")
    if scored:
        columns = list(columns or SCORED_COLUMNS)
        if len(columns) != 3:
            raise ValueError(f"scored pairs need 3 columns (sentence1, sentence2, score); got {columns}")
        check_pair_columns(path, columns, found, scored, held_out)
        rows = read_rows(path, text_columns=columns[:2], label_column=columns[2])
        scores = [parse_score(value, path, line) for value, line in zip(rows.labels, rows.row_numbers)]
        anchors, positives = (list(side) for side in zip(*rows.texts))
        return SentencePairs(anchors, positives, scores=scores)
    if columns is None:
        columns = TRIPLET_COLUMNS if "negative" in found else PAIR_COLUMNS
    if len(columns) not in (2, 3):
        raise ValueError(f"pairs need 2 columns (anchor, positive) and triplets 3 (anchor, positive, negative); "
                         f"got {columns}")
    check_pair_columns(path, columns, found, scored, held_out)
    rows = read_rows(path, text_columns=list(columns), max_texts=3)
    sides = [list(side) for side in zip(*rows.texts)]
    return SentencePairs(sides[0], sides[1], negatives=sides[2] if len(sides) == 3 else None)


def check_pair_columns(path: Path, columns: list[str], found: list[str], scored: bool, held_out: bool) -> None:
    """Raise ValueError for the first of `columns` the file lacks: what the file looks like, and the fix
    that fits where it was given (training data can name its columns; held-out data cannot)."""
    missing = [column for column in columns if column not in found]
    if not missing:
        return
    kind = "a triplet file" if "negative" in found else "a pair file" if "positive" in found else None
    problem = f"{path} has no column {missing[0]!r} (found {found})"
    looks = f": it looks like {kind}, but" if kind else ";"
    if held_out:
        raise ValueError(f"{problem}{looks} held-out data is scored pairs (sentence1, sentence2, score) or a BEIR "
                         "folder (queries.jsonl, corpus.jsonl, qrels.tsv)")
    if scored:
        raise ValueError(f"{problem}{looks} this loss trains on scored pairs (sentence1, sentence2, score); use "
                         "loss mnrl for pairs and triplets, or name the file's columns with data.columns")
    raise ValueError(f"{problem}; pairs need anchor and positive columns (triplets also negative): rename them, "
                     "or name the file's columns with data.columns")


def parse_score(value, path: Path, line: int) -> float:
    try:
        score = float(value)
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        raise ValueError(f"{path}:{line}: score {value!r} is not a finite number; scored pairs need numeric scores")
    return score


@dataclass
class RetrievalSet:
    """Queries, a corpus and which documents are relevant to each query, by id: a list of ids (each of grade 1), or
    {id: grade} as graded qrels give them (`read_qrels`)."""

    query_ids: list[str]
    queries: list[str]
    corpus_ids: list[str]
    corpus: list[str]
    relevant: dict[str, list[str] | dict[str, float]]


def read_retrieval_set(queries: str | os.PathLike, corpus: str | os.PathLike, qrels: str | os.PathLike
                       ) -> RetrievalSet:
    """A BEIR-layout set; only queries with a relevant document are kept (as BEIR evaluates them).

    A relevant id missing from the corpus counts as relevant and never found, as BEIR counts it
    (`metrics.relevant_indices` says how many). Raises ValueError for a missing file, a line without
    _id/text, a duplicate id, a qrels row that is not query-id, corpus-id, score, qrels naming no
    document of the corpus at all (ids that do not match), or no query left.
    """
    query_texts = read_texts_by_id(Path(queries))
    corpus_texts = read_texts_by_id(Path(corpus))
    relevant = read_qrels(Path(qrels))
    named = [doc_id for documents in relevant.values() for doc_id in documents]
    if named and not any(doc_id in corpus_texts for doc_id in named):  # a few missing are BEIR's; all, a mismatch
        raise ValueError(f"{qrels}: none of the documents it names is in {corpus} (e.g. {named[0]!r}); check that "
                         "their ids match")
    query_ids = [query_id for query_id in query_texts if relevant.get(query_id)]
    if not query_ids:
        raise ValueError(f"no query in {queries} has a relevant document in {qrels}; check that their ids match")
    return RetrievalSet(query_ids, [query_texts[q] for q in query_ids], list(corpus_texts),
                        list(corpus_texts.values()), {q: relevant[q] for q in query_ids})


def beir_qrels(folder: Path, split: str = "test") -> Path:
    """A BEIR folder's qrels for `split` ("test": what is reported; "dev": what picks a checkpoint or a weight):
    qrels/SPLIT.tsv (BEIR's own layout, every split in one folder) or qrels.tsv (what `bertforge sbert prepare` writes,
    a folder a split). Without either, the other split's qrels/*.tsv, said in a warning: a test set of only dev
    judgments is BEIR's MS MARCO; a dev set of only test judgments picks by the scores it then reports, so they
    are not held out. qrels/SPLIT.tsv when none is there, for read_qrels to name as missing."""
    other = {"test": "dev", "dev": "test"}[split]
    wanted = folder / "qrels" / f"{split}.tsv"
    found = next((path for path in (wanted, folder / "qrels.tsv") if path.is_file()), None)
    if found is not None:
        return found
    fallback = folder / "qrels" / f"{other}.tsv"
    if not fallback.is_file():
        return wanted
    consequence = ("the checkpoint or weight it picks is picked on the test queries, whose scores are then not "
                   "held out" if split == "dev" else "its dev judgments stand for a test split (BEIR's MS MARCO)")
    logger.warning("%s has no qrels/%s.tsv: judging by %s; %s", folder, split, fallback, consequence)
    return fallback


def read_texts_by_id(path: Path) -> dict[str, str]:
    require_file(path, "retrieval set file", "a retrieval set needs queries.jsonl, corpus.jsonl and a qrels .tsv")
    texts: dict[str, str] = {}
    for line, record in jsonl_objects(path):
        found = corpus_record(record, f"{path}:{line}", id_field="_id", advice="BEIR's layout has it under 'text'")
        key = found.id
        if key in texts:
            raise ValueError(f"{path}:{line}: id {key!r} appears twice; ids must be unique")
        texts[key] = titled(found.title, found.text)
    if not texts:
        raise ValueError(f"{path} is empty")
    return texts


def read_qrels(path: Path) -> dict[str, dict[str, float]]:
    """query-id -> {relevant corpus-id: its grade} (score > 0: BEIR's 0 is judged not relevant) from a TSV with or
    without BEIR's header line. The grade is nDCG's gain (`metrics`), as BEIR's pytrec_eval takes it."""
    require_file(path, "qrels file", "BEIR's are qrels/test.tsv (and dev.tsv): query-id, corpus-id, score")
    relevant: dict[str, dict[str, float]] = {}
    with open_table(path) as rows:  # BEIR's qrels are .tsv
        for line, row in enumerate(rows, start=1):
            if not row or (line == 1 and row[0] == "query-id"):
                continue
            try:
                query_id, doc_id, score = row[0], row[1], float(row[2])
            except (IndexError, ValueError):
                raise ValueError(f"{path}:{line}: expected query-id<TAB>corpus-id<TAB>score, got {row}") from None
            if score > 0:
                relevant.setdefault(query_id, {})[doc_id] = score
    return relevant


def write_retrieval_set(folder: Path, retrieval_set: RetrievalSet) -> None:
    """queries.jsonl, corpus.jsonl and qrels.tsv in `folder`, the layout read_retrieval_set reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, ids, texts in (("queries.jsonl", retrieval_set.query_ids, retrieval_set.queries),
                             ("corpus.jsonl", retrieval_set.corpus_ids, retrieval_set.corpus)):
        with replaced_file(folder / name) as temporary:
            temporary.write_text("".join(json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n"
                                         for i, t in zip(ids, texts)), encoding="utf-8")
    with replaced_file(folder / "qrels.tsv") as temporary:
        lines = ["query-id\tcorpus-id\tscore\n"] + [f"{q}\t{d}\t{grade:g}\n" for q in retrieval_set.query_ids
                                                    for d, grade in graded(retrieval_set.relevant[q]).items()]
        temporary.write_text("".join(lines), encoding="utf-8")
