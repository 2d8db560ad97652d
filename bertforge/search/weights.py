"""An existing index's dense weight picked from judged queries (`bertforge index weight --tune`), with its sentence
and neighbour weights where it has sentence vectors and neighbours (the command tries each, `weight_ndcg` a time).

Each weight of tasks/retrieval/hybrid.py's WEIGHTS is scored by the nDCG@10 of what the index's own
search ranks at that weight (`Index.rank`: the rows `search` returns, the pool of a large or
approximate index included), and hybrid.best_weight keeps the best, the rule adapt picks its index's
weight by. The judgements are a BEIR folder's queries.jsonl and qrels whose document ids are the
index's passage ids: an index built from a BEIR corpus.jsonl, or adapt's DIR/index of one (both keep a
record's "_id"). Qrels judge documents, and adapt splits a long one
into parts ID#0, ID#1, ... (search/corpus.py's part_id): a ranking is scored by document, each counted
once, at the rank of its best part.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tasks.retrieval.baselines import require_bm25s
from ..tasks.retrieval.hybrid import WEIGHTS
from ..tasks.retrieval.metrics import NDCG_AT, ranking_metrics
from ..tasks.retrieval.reader import beir_qrels, read_qrels, read_texts_by_id
from .corpus import PassageId, whole_id
from .index import Index


@dataclass
class JudgedQueries:
    """Queries with a relevant document in one index. A document is a row, or every part of a passage split in
    parts; documents are numbered in order of their first row, then the judged ones the index lacks."""

    texts: list[str]
    relevant_documents: list[dict[int, float]]  # each query's {document: grade}
    own_documents: list[int | None]  # the one whose id is the query's: never ranked for it, as BEIR leaves it out
    left_out: int                    # judged queries none of whose relevant ids is in the index
    row_documents: np.ndarray        # (rows,): the document each row of the index is (part of)


def read_judged_queries(folder: str | Path, index: Index) -> JudgedQueries:
    """The queries of a BEIR folder (queries.jsonl; its dev split's qrels, `beir_qrels`) judged against `index`'s
    passages.

    Ids are compared as text: qrels hold text, an index's ids are str or int; a part ID#k of a passage is judged
    as ID (`document_id`). Raises ValueError for a missing or malformed file, or when no query has a relevant id
    that is a passage of the index.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"--tune {folder} is not a folder; give a BEIR folder (queries.jsonl and qrels/dev.tsv, "
                         "whose document ids are the index's passage ids)")
    qrels = beir_qrels(folder, "dev")  # what picks a weight: the dev split where the folder has one
    queries, relevant = read_texts_by_id(folder / "queries.jsonl"), read_qrels(qrels)
    judged_ids = [query_id for query_id in queries if relevant.get(query_id)]
    if not judged_ids:
        raise ValueError(f"no query in {folder / 'queries.jsonl'} has a relevant document in {qrels}; "
                         "check that their ids match")
    named = {*judged_ids, *(doc_id for query_id in judged_ids for doc_id in relevant[query_id])}
    documents: dict[str, int] = {}
    row_documents = [documents.setdefault(document_id(passage_id, named), len(documents))
                     for passage_id in index.row_ids()]
    judged = JudgedQueries([], [], [], 0, np.array(row_documents, dtype=np.int64))
    for query_id in judged_ids:
        if not any(doc_id in documents for doc_id in relevant[query_id]):
            judged.left_out += 1
            continue
        judged.texts.append(queries[query_id])
        # A judged document the index lacks (a duplicate adapt dropped) stays relevant, never found, as BEIR and
        # pytrec_eval count it: left out, it lowered the ideal and a query scored 1.0 for finding the rest.
        judged.relevant_documents.append({documents.setdefault(doc_id, len(documents)): grade
                                          for doc_id, grade in relevant[query_id].items()})
        judged.own_documents.append(documents.get(query_id))
    if not judged.texts:
        example = next(iter(relevant[judged_ids[0]]))
        raise ValueError(f"no document id in {qrels} is a passage id of the index ({example!r} is not; the index's "
                         f"ids look like {next(index.row_ids())!r}); build the index with the corpus's ids "
                         "(a BEIR corpus.jsonl's _id is read as it is; --id-field names another field)")
    return judged


def document_id(passage_id: PassageId, named: set[str]) -> str:
    """The id the qrels know a row by: its own where they name it (an id may hold '#'), else the whole passage's."""
    text = str(passage_id)
    return text if text in named else whole_id(text)


def weight_ndcg(index: Index, judged: JudgedQueries, sentence_weight: float | None = None,
                vectors: np.ndarray | None = None, neighbour_weight: float | None = None) -> dict[float, float]:
    """{weight: nDCG@10} over the judged queries for each weight of WEIGHTS, as `index.search` ranks at it (and at
    `sentence_weight` and `neighbour_weight`: None, the index's). vectors: the queries' (`index.query_vectors`),
    when already made.

    Raises ValueError naming the install when bm25s is missing (every weight below 1 needs it).
    """
    require_bm25s()  # before embedding the queries
    vectors = index.query_vectors(judged.texts) if vectors is None else vectors  # once, for every weight
    # Deep enough for 11 documents (one spare: a query's own is dropped) even if each has as many parts as the most.
    depth = (NDCG_AT + 1) * int(np.bincount(judged.row_documents).max())
    # A query's own passage (every part) out of the fusion's normalisation too, or it sets both maxima (fuse's doc)
    own_rows = [None if own is None else np.flatnonzero(judged.row_documents == own) for own in judged.own_documents]
    scores = {}
    for weight in WEIGHTS:
        rows = index.rank(vectors, judged.texts, depth, weight, own_rows, sentence_weight, neighbour_weight).rows
        ranked = np.full((len(rows), NDCG_AT), -1, dtype=np.int64)  # -1: past a ranking shorter than 10
        for query, (query_rows, own_document) in enumerate(zip(rows, judged.own_documents)):
            documents = ranked_documents(query_rows, judged.row_documents, own_document)[:NDCG_AT]
            ranked[query, :len(documents)] = documents
        scores[weight] = ranking_metrics(ranked, judged.relevant_documents)[f"ndcg@{NDCG_AT}"]
    return scores


def ranked_documents(rows: np.ndarray, row_documents: np.ndarray, left_out: int | None) -> list[int]:
    """A ranking of rows (-1 past its end) -> its documents, best first, each once (at its best part's rank)."""
    documents = (int(document) for document in row_documents[rows[rows >= 0]])
    return list(dict.fromkeys(document for document in documents if document != left_out))
