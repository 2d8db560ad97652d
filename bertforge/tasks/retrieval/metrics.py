"""Retrieval and similarity metrics, with numpy: recall@k, MRR@k, nDCG@k from a score matrix; Spearman.

A query's relevant documents are a sequence (each of grade 1) or a mapping document -> grade (graded qrels:
`reader.read_qrels`). recall@k is the share of a query's relevant documents (grade above 0) in its top k; MRR@k
the reciprocal rank of the first relevant one (0 past k); nDCG@k the discounted gain grade/log2(rank + 1) of the
ranked documents in the top k over the best achievable (the grades sorted, best first). Each is the mean over
queries. These are BEIR's and MTEB's definitions (pytrec_eval's recall_k and ndcg_cut_k, the grade as the gain),
and with grades of 1 sentence-transformers' InformationRetrievalEvaluator's too, which reads qrels as sets.
Ties are broken by corpus position, so a ranking never depends on luck (sentence-transformers breaks them by corpus id: the same on a corpus
in id order; an audit's exact duplicates, 2026-11-27, moved nDCG@10 0.745 -> 0.802 between the two).
`evaluation.evaluate_retrieval` leaves out a document with the query's own id, as BEIR does
(`ignore_identical_ids`) and sentence-transformers does not: review-to-review sets hold each query.
`left_out` is that rule; a fused scorer applies it before it normalises (hybrid.fuse).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np

logger = logging.getLogger("bertforge")

RECALL_AT = (1, 10)
MRR_AT = 10
NDCG_AT = 10

# A query's relevant documents: their indices (each of grade 1), or each index with its grade (graded qrels)
Relevant = Union[Sequence[int], Mapping[int, float]]


def graded(documents: Sequence | Mapping) -> dict:
    """A query's relevant documents (ids or indices) as {document: grade}: a mapping's grades as they are, each
    document of a sequence at grade 1 (a sequence naming one twice holds it once)."""
    if isinstance(documents, Mapping):
        return {document: float(grade) for document, grade in documents.items()}
    return dict.fromkeys(documents, 1.0)


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """(queries, documents) scores -> (queries, min(k, documents)) document indices, best first.

    Equal scores keep corpus order (lower index first): the first k of a stable sort of the negated
    scores, without sorting every document: only those scoring at least the k-th best are sorted.
    """
    if k >= scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")
    kth_best = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    columns = []
    for row_scores, threshold in zip(scores, kth_best):
        candidates = np.flatnonzero(row_scores >= threshold)
        columns.append(candidates[np.argsort(-row_scores[candidates], kind="stable")[:k]])
    return np.stack(columns)


def retrieval_metrics(scores: np.ndarray, relevant: Sequence[Relevant], *,
                      exclude: Sequence[int | None] | None = None,
                      recall_at: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """recall@k for k in recall_at (1 and 10 by default), mrr@10, ndcg@10 (means over queries) from a score matrix.

    scores: (queries, documents), higher is better. relevant[q]: the indices of query q's
    relevant documents (at least one each), or a mapping index -> grade. exclude[q]: a document index never
    ranked for query q (the query's own copy in the corpus, as BEIR leaves it out), or None.
    Raises ValueError for a query without relevant documents or mismatched lengths.
    """
    scores = np.array(scores, dtype=np.float64)  # a copy: excluded documents are set to -inf below
    if scores.ndim != 2 or len(relevant) != scores.shape[0]:
        raise ValueError(f"scores must be (queries, documents) with one relevant set per query; got scores "
                         f"{scores.shape} and {len(relevant)} relevant sets")
    ranked = top_k(left_out(scores, exclude), max(*recall_at, MRR_AT, NDCG_AT))
    for query, document in enumerate(exclude or ()):  # ranked last, yet within the depth of a small corpus: not found
        if document is not None:
            ranked[query][np.isin(ranked[query], document)] = -1
    return ranking_metrics(ranked, relevant, recall_at=recall_at)


def left_out(scores: np.ndarray, exclude: Sequence | None) -> np.ndarray:
    """scores (queries, documents) with exclude[q]'s document(s) set to -inf in row q, in place, and returned.

    exclude[q]: a document index (or several) never ranked for query q, or None; exclude None: none. The one rule
    for a query's own document: `retrieval_metrics` ranks it last and drops it, `hybrid.fuse` sets no bound of its
    normalisation by it (the query's own copy, cosine ~1 and the top BM25 score, squashed every other document).
    """
    for query, document in enumerate(exclude or ()):
        if document is not None:
            scores[query, document] = -np.inf
    return scores


def ranking_metrics(ranked: np.ndarray, relevant: Sequence[Relevant], *,
                    recall_at: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """The metrics of `retrieval_metrics` from rankings already made: ranked[q] is query q's document indices,
    best first (queries, depth), -1 where a ranking is shorter (never relevant).

    A search that returns its top hits (an index's) is measured here; what lies past `depth` counts as
    not found, so depth should reach max(recall_at) and 10. Raises ValueError for a query without
    relevant documents.
    """
    grades = checked_grades(relevant)
    gains = ranked_gains(ranked, grades)  # (queries, depth)
    hits = gains > 0
    counts = np.array([len(query_grades) for query_grades in grades], dtype=np.float64)
    results = {f"recall@{k}": float(np.mean(hits[:, :k].sum(axis=1) / counts)) for k in recall_at}
    first = np.where(hits[:, :MRR_AT].any(axis=1), hits[:, :MRR_AT].argmax(axis=1) + 1, np.inf)
    results[f"mrr@{MRR_AT}"] = float(np.mean(1.0 / first))
    results[f"ndcg@{NDCG_AT}"] = float(np.mean(ndcg_of_gains(gains, grades)))
    return results


def checked_grades(relevant: Sequence[Relevant]) -> list[dict[int, float]]:
    """Each query's {document index: grade} (`graded`); raises ValueError naming a query without a relevant
    document (grade above 0)."""
    grades = [{document: grade for document, grade in graded(documents).items() if grade > 0}
              for documents in relevant]
    for query, query_grades in enumerate(grades):
        if not query_grades:
            raise ValueError(f"query {query} has no relevant document; every query needs at least one")
    return grades


def ranked_gains(ranked: np.ndarray, grades: Sequence[Mapping[int, float]]) -> np.ndarray:
    """(queries, depth) the grade of each ranked document, 0 where it is not relevant (and at -1, past a short
    ranking: no document has that index)."""
    gains = np.zeros(ranked.shape, dtype=np.float64)
    for query, query_grades in enumerate(grades):
        documents = np.fromiter(query_grades, dtype=np.int64, count=len(query_grades))
        values = np.fromiter(query_grades.values(), dtype=np.float64, count=len(query_grades))
        gains[query] = (ranked[query][:, None] == documents[None, :]) @ values  # each index once in a ranking
    return gains


def ndcg_of_gains(gains: np.ndarray, grades: Sequence[Mapping[int, float]]) -> np.ndarray:
    """Each query's nDCG@10 (queries,): gains (queries, depth) the grade of each ranked document (`ranked_gains`)
    over the ideal ranking's, the query's grades sorted, best first (relevant documents the corpus lacks among
    them: BEIR's ideal counts every judged one)."""
    discounts = 1.0 / np.log2(np.arange(2, NDCG_AT + 2))
    found = (gains[:, :NDCG_AT] * discounts[:min(gains.shape[1], NDCG_AT)]).sum(axis=1)
    ideal = np.array([np.dot(sorted(query_grades.values(), reverse=True)[:NDCG_AT],
                             discounts[:min(len(query_grades), NDCG_AT)]) for query_grades in grades])
    return found / ideal


def ndcg_per_query(scores: np.ndarray, relevant: Sequence[Relevant]) -> np.ndarray:
    """Each query's nDCG@10 (queries,) from a score matrix, the values `retrieval_metrics` averages (no query
    left out): what a paired comparison of two rankers over the same queries needs."""
    grades = checked_grades(relevant)
    return ndcg_of_gains(ranked_gains(top_k(np.asarray(scores), NDCG_AT), grades), grades)


def relevant_indices(query_ids: Sequence[str], corpus_ids: Sequence[str],
                     relevant: Mapping[str, Sequence[str] | Mapping[str, float]]) -> list[dict[int, float]]:
    """qrels by id (each query's relevant ids, or ids with their grades) -> {corpus position: grade} per query, in
    query order.

    A relevant id the corpus lacks (BEIR's sets have a few) is relevant and never found, as pytrec_eval and
    sentence-transformers' evaluator count it: a position of its own below -1, which no ranking holds; said
    once in a warning, with how many. Raises ValueError naming a query without relevant documents.
    """
    position = {doc_id: index for index, doc_id in enumerate(corpus_ids)}
    unfindable: dict[str, int] = {}
    indices = []
    for query_id in query_ids:
        grades = graded(relevant.get(query_id, ()))
        if not grades:
            raise ValueError(f"query {query_id!r} has no relevant document in the qrels; drop it or add one")
        for doc_id in grades:
            if doc_id not in position:
                unfindable.setdefault(doc_id, -2 - len(unfindable))
        indices.append({position[doc_id] if doc_id in position else unfindable[doc_id]: grade
                        for doc_id, grade in grades.items()})
    if unfindable:
        example = next(iter(unfindable))
        logger.warning("%d relevant document(s) in the qrels are not in the corpus (e.g. %r): counted as relevant "
                       "and never found, as BEIR's evaluation counts them", len(unfindable), example)
    return indices


def spearman(predicted: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation of predicted similarities with gold scores (the STS benchmark metric)."""
    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if predicted.shape != gold.shape or predicted.ndim != 1 or len(gold) < 2:
        raise ValueError(f"spearman needs two equal-length 1-D arrays of at least 2 values; got {predicted.shape} "
                         f"and {gold.shape}")
    from scipy import stats  # here: scipy.stats takes 0.75 s to import, and every retrieval metric but this is numpy

    return float(stats.spearmanr(predicted, gold).statistic)
