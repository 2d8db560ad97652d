"""Hybrid search: an index's cosines and BM25 over its passages, fused by tasks/retrieval/hybrid.py's `fuse`.

The rule is `fuse`'s (each side min-max normalised per query over the same candidates, then
dense_weight * dense + (1 - dense_weight) * lexical); this module only picks the candidates:

- a flat index of at most EXACT_HYBRID_UP_TO rows: every row. Both sides are normalised over the
  whole index, so the ranking is `hybrid_scorer(encoder, bm25, w)`'s over the corpus (tested).
- a bigger flat index, or ivf / hnsw: a pool per query, the dense top-K (the FAISS search, so
  approximate for ivf / hnsw) joined with the BM25 top-K (rows of positive BM25 score), K =
  max(POOL_SIZE, top_k); both sides are normalised over the pool, so a query's first hits do not depend on
  how many are asked for up to POOL_SIZE (K grew with top_k until 2026-11-27: on Python's FAQ with an hnsw
  index 13 of 175 queries ranked their first 10 otherwise at top_k 11, the depth `index weight --tune`
  reads, than at the 10 `search` shows). Normalised over a pool, not the corpus, the fused ranking is
  close to the exact one but not equal (Python's FAQ, MiniLM, weight 0.9: nDCG@10 0.752 pooled at 100 rows
  against 0.756 exact; the pool of 1,000 narrows that). The pool's
  dense scores are recomputed from the stored vectors (`ann.stored_vectors`: exact for every kind
  here), its BM25 scores are exact (bm25s scores every row).

Where the index holds sentence vectors and searches with a sentence weight, the dense side is the mixed score of
tasks/retrieval/sentences.py (`mix`, a sentence_vectors.SentenceMix) wherever it is the cosine above: every row's,
or the pool's (its rows' best sentences scored exactly too); the pool itself is still FAISS's passage neighbours.

The BM25 side is a bm25s index over the passages in row order (`bm25_index`), which `Index` builds
on its first hybrid search and keeps (docs/search.md gives the cost).
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import numpy as np

from ..tasks.retrieval.baselines import bm25_query_scores, require_bm25s
from ..tasks.retrieval.hybrid import fuse
from ..tasks.retrieval.metrics import top_k
from ..validation import checked
from . import ann
from .ann import faiss

# Scoring every row reads every stored vector, as a flat search does anyway: at 200,000 rows a query
# took 38.8 ms exact, 37.7 ms pooled, 35.3 ms dense alone (docs/search.md). Past it the pool leaves the
# dense side to FAISS's own search (a GPU replica where there is one) and never scans in numpy.
EXACT_HYBRID_UP_TO = 200_000
# Queries scored against every row at once, at most this many scores (16 MB of float32 per array):
# a thousand queries on 200,000 rows would otherwise hold several GB of score matrices.
EXACT_BLOCK_SCORES = 1 << 22
POOL_SIZE = 1_000


class Ranked(NamedTuple):
    """Per query, the best rows first: arrays (queries, k); dense and lexical are None for a dense-only search."""
    rows: np.ndarray             # int64, -1 where FAISS found fewer than k
    scores: np.ndarray           # what ranks: the fused score, or the inner product alone
    dense: np.ndarray | None     # inner product (cosine for normalised vectors)
    lexical: np.ndarray | None   # BM25


def check_dense_weight(dense_weight) -> float | None:
    """A user's dense weight (0..1, validation.BOUNDS), None kept; below 1 bm25s must be installed.

    Raises UsageError for a weight outside 0..1 or not a number, ValueError naming the install for bm25s.
    """
    if dense_weight is None:
        return None
    dense_weight = checked("dense_weight", dense_weight, float)
    if dense_weight < 1.0:
        require_bm25s()
    return dense_weight


def pool_size(top_k: int, count: int) -> int:
    """Candidates per side of a pooled hybrid search: POOL_SIZE whatever top_k up to it, so the ranking of a
    query's first hits is the same at every top_k (more only when more hits are asked for)."""
    return min(count, max(POOL_SIZE, top_k))


def hybrid_top_k(faiss_index: faiss.Index, kind: str, searcher: faiss.Index, bm25, vectors: np.ndarray,
                 texts: Sequence[str], top_k: int, dense_weight: float, exclude: Sequence | None = None,
                 mix=None) -> Ranked:
    """The top_k rows of each query by fused score (see the module doc for which rows are scored).

    vectors: the queries' vectors (queries, dim), texts: the same queries' texts; bm25: a
    bm25_index over the index's passages in row order; searcher: the index to search (ann.gpu_replica's or
    faiss_index itself). exclude[q]: rows (an array, or None) query q never ranks, `fuse`'s exclude: score
    -inf, set no bound of the normalisation (`index weight --tune` leaves out a query's own passage, as BEIR).
    mix: a sentence_vectors.SentenceMix making the dense side the mixed score, or None (the cosine alone).
    """
    count = int(faiss_index.ntotal)
    k = min(top_k, count)
    exclude = exclude if exclude is not None else [None] * len(vectors)
    if kind == "flat" and count <= EXACT_HYBRID_UP_TO:
        per_block = [fused_top_k(dense, bm25_query_scores(bm25, texts[part]), dense_weight, k, exclude[part])
                     for part, dense in every_row_dense(faiss_index, vectors, mix)]
        return Ranked(*(np.concatenate(part) for part in zip(*per_block)))
    size = pool_size(top_k, count)
    _, dense_rows = searcher.search(vectors, size)
    per_query = [pooled_top_k(faiss_index, kind, vector, bm25_query_scores(bm25, [text])[0], rows, size, k,
                              dense_weight, left, mix)
                 for vector, text, rows, left in zip(vectors, texts, dense_rows, exclude)]
    return Ranked(*(np.concatenate(part) for part in zip(*per_query)))


def every_row_dense(faiss_index: faiss.Index, vectors: np.ndarray, mix=None) -> Iterator[tuple[slice, np.ndarray]]:
    """(queries' slice, their dense scores of every row of a flat index), a block of queries at a time (at most
    EXACT_BLOCK_SCORES scores); the dense score is the inner product, or `mix`'s (sentence_vectors.SentenceMix)."""
    stored, block = ann.flat_vectors(faiss_index), max(1, EXACT_BLOCK_SCORES // int(faiss_index.ntotal))
    for start in range(0, len(vectors), block):
        part = slice(start, start + block)
        cosines = vectors[part] @ stored.T
        yield part, cosines if mix is None else mix.every_row(vectors[part], cosines)


def pooled_top_k(faiss_index: faiss.Index, kind: str, vector: np.ndarray, lexical: np.ndarray, dense_rows: np.ndarray,
                 size: int, k: int, dense_weight: float, exclude: np.ndarray | None = None, mix=None) -> Ranked:
    """One query's top k over its pool: its dense rows (FAISS's top `size`) and BM25's top `size` rows.

    lexical: (rows,) the query's BM25 score of every row. Rows of BM25 score 0 join only as dense rows.
    exclude: rows never ranked (hybrid_top_k), or None. mix: as hybrid_top_k's.
    """
    lexical_rows = np.argpartition(-lexical, size - 1)[:size] if size < len(lexical) else np.arange(len(lexical))
    pool = np.union1d(dense_rows[dense_rows >= 0], lexical_rows[lexical[lexical_rows] > 0])
    dense = ann.stored_vectors(faiss_index, kind, pool) @ vector
    dense = dense if mix is None else mix.of_rows(vector, pool, dense)
    left = None if exclude is None else [np.flatnonzero(np.isin(pool, exclude))]  # by column of the pool
    ranked = fused_top_k(dense[None], lexical[pool][None], dense_weight, k, left)
    ranked = ranked._replace(rows=pool[ranked.rows])
    missing = k - len(pool)  # an ivf search short of `size` rows, and few rows sharing a word with the query
    if missing > 0:  # rows -1, as FAISS pads
        ranked = Ranked(*(np.pad(part, ((0, 0), (0, missing)), constant_values=-1 if part.dtype.kind == "i" else np.nan)
                          for part in ranked))
    return ranked


def fused_top_k(dense: np.ndarray, lexical: np.ndarray, dense_weight: float, k: int,
                exclude: Sequence | None = None) -> Ranked:
    """The top k columns of `fuse(dense, lexical, dense_weight, exclude)`, (queries, candidates) in, per query."""
    fused = fuse(dense, lexical, dense_weight, exclude)
    columns = top_k(fused, k)
    return Ranked(columns, *(np.take_along_axis(part, columns, 1) for part in (fused, dense, lexical)))
