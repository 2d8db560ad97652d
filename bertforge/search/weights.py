"""An existing index's dense weight picked from judged queries (`bertforge index weight --tune`).

Each weight of tasks/retrieval/hybrid.py's WEIGHTS is scored by the nDCG@10 of what the index's own
search ranks at that weight (`Index.rank`: the rows `search` returns, the pool of a large or
approximate index included), and hybrid.best_weight keeps the best, the rule adapt picks its index's
weight by. The judgements are a BEIR folder's queries.jsonl and qrels whose document ids are the
index's passage ids: an index built from a BEIR corpus.jsonl with `--id-field _id`, or adapt's
DIR/index of one (adapt keeps a record's "_id").
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tasks.retrieval.baselines import require_bm25s
from ..tasks.retrieval.hybrid import WEIGHTS
from ..tasks.retrieval.metrics import NDCG_AT, ranking_metrics
from ..tasks.retrieval.reader import beir_qrels, read_qrels, read_texts_by_id
from .index import Index


@dataclass
class JudgedQueries:
    """Queries whose relevant passages are rows of one index."""

    texts: list[str]
    relevant_rows: list[list[int]]
    own_rows: list[int | None]  # the row whose id is the query's own: never ranked for it, as BEIR leaves it out
    left_out: int               # judged queries none of whose relevant ids is in the index


def read_judged_queries(folder: str | Path, index: Index) -> JudgedQueries:
    """The queries of a BEIR folder (queries.jsonl, qrels/test.tsv or qrels.tsv) judged against `index`'s passages.

    Ids are compared as text: qrels hold text, an index's ids are str or int. Raises ValueError for a
    missing or malformed file, or when no query has a relevant id that is a passage of the index.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--tune {folder} is not a folder; give a BEIR folder (queries.jsonl and qrels/test.tsv, "
                         "whose document ids are the index's passage ids)")
    qrels = beir_qrels(folder)
    queries, relevant = read_texts_by_id(folder / "queries.jsonl"), read_qrels(qrels)
    judged_ids = [query_id for query_id in queries if relevant.get(query_id)]
    if not judged_ids:
        raise ValueError(f"no query in {folder / 'queries.jsonl'} has a relevant document in {qrels}; "
                         "check that their ids match")
    rows: dict[str, int] = {}
    for row, passage_id in enumerate(index.row_ids()):
        rows.setdefault(str(passage_id), row)
    judged = JudgedQueries([], [], [], 0)
    for query_id in judged_ids:
        found = [rows[doc_id] for doc_id in relevant[query_id] if doc_id in rows]
        if not found:
            judged.left_out += 1
            continue
        judged.texts.append(queries[query_id])
        judged.relevant_rows.append(found)
        judged.own_rows.append(rows.get(query_id))
    if not judged.texts:
        example = relevant[judged_ids[0]][0]
        raise ValueError(f"no document id in {qrels} is a passage id of the index ({example!r} is not; the index's "
                         f"ids look like {next(index.row_ids())!r}); build the index with the corpus's ids "
                         "(`--id-field _id` for a BEIR corpus.jsonl)")
    return judged


def weight_ndcg(index: Index, judged: JudgedQueries) -> dict[float, float]:
    """{weight: nDCG@10} over the judged queries for each weight of WEIGHTS, as `index.search` ranks at it.

    Raises ValueError naming the install when bm25s is missing (every weight below 1 needs it).
    """
    require_bm25s()  # before embedding the queries
    vectors = index.query_vectors(judged.texts)  # once, for every weight
    scores = {}
    for weight in WEIGHTS:
        rows = index.rank(vectors, judged.texts, NDCG_AT + 1, weight).rows  # one spare: a query's own row is dropped
        ranked = np.full((len(rows), NDCG_AT), -1, dtype=np.int64)  # -1: past a ranking shorter than 10
        for query, (query_rows, own_row) in enumerate(zip(rows, judged.own_rows)):
            kept = [row for row in query_rows if row != own_row][:NDCG_AT]
            ranked[query, :len(kept)] = kept
        scores[weight] = ranking_metrics(ranked, judged.relevant_rows)[f"ndcg@{NDCG_AT}"]
    return scores
