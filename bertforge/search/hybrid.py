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

Where the index ranks with a neighbour weight (tasks/retrieval/neighbours.py: each passage's score mixes in its
best neighbour's in the same document; `NeighbourMix`), the mix is of the final score, the fused one: over every row
as they are, or over the pool joined by each pooled row's neighbours (scored as the pool is: up to 2x its rows).

The BM25 side is a bm25s index over the passages in row order (`bm25_index`), which `Index` builds
on its first hybrid search and keeps (docs/search.md gives the cost).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from ..tasks.retrieval.baselines import bm25_query_scores, require_bm25s
from ..tasks.retrieval.hybrid import fuse
from ..tasks.retrieval.metrics import top_k
from ..tasks.retrieval.neighbours import continuing, neighbour_mixed, with_neighbours
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


@dataclass(frozen=True)
class NeighbourMix:
    """The final score mixed with each row's best neighbour's (tasks/retrieval/neighbours.py's `neighbour_mixed`,
    the one rule) at `weight`, follows (rows,) being whether each row of the index continues the previous row's
    document. `Index.neighbour_mix` makes one only where the weight is above 0 and some row follows another: None
    ranks as before, by the same code."""

    follows: np.ndarray
    weight: float

    def pool(self, rows: np.ndarray) -> np.ndarray:
        """The rows a pool scores: `rows` (row numbers) joined by each one's neighbours, ascending."""
        return with_neighbours(rows, self.follows)

    def mixed(self, scores: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """(queries, columns) scores mixed: of every row (rows None), or of `rows` (ascending: a pool)."""
        follows = self.follows if rows is None else continuing(self.follows, rows)
        return neighbour_mixed(scores, follows, self.weight)


def check_weight(name: str, weight) -> float | None:
    """A user's weight `name` (dense_weight, sentence_weight, neighbour_weight: 0..1, validation.BOUNDS), None kept;
    UsageError outside 0..1 or not a number."""
    return None if weight is None else checked(name, weight, float)


class NeighbourWeight:
    """`Index`'s neighbour weight (Index inherits this): meta.json's neighbour_weight (0 where it has none: each
    passage alone), and which rows continue the previous row's document (`follows`), read once when a search first
    mixes neighbours in."""

    meta: dict
    store: object          # store.TextStore of the committed rows, or None
    pending: list          # corpus.Passage of the rows added since
    _follows: np.ndarray | None

    @property
    def neighbour_weight(self) -> float:
        """The share of each passage's best neighbour in its score a search uses by default."""
        return float(self.meta.get("neighbour_weight") or 0.0)

    def set_neighbour_weight(self, neighbour_weight: float | None) -> None:
        """Make searches mix each passage's score with its best neighbour's in the same document by default, with
        this weight (0..1; None: not at all). Kept in meta.json as the dense weight is; above 0 the folder is of
        format 5 (folder.NEIGHBOURS_VERSION). An index whose rows follow none (a corpus of records) takes it and
        ranks as at 0. Raises UsageError outside 0..1."""
        weight = check_weight("neighbour_weight", neighbour_weight)
        if weight is None:
            self.meta.pop("neighbour_weight", None)
        else:
            self.meta["neighbour_weight"] = weight

    @property
    def follows(self) -> np.ndarray:
        """(rows,) bool: whether each row continues the previous row's document (corpus.Passage.follows): the
        committed rows' read from the folder on first use (a pass over texts.jsonl, as BM25's), then kept; `add`
        extends it."""
        if self._follows is None:
            committed = self.store.follows() if self.store is not None else ()
            self._follows = np.fromiter(chain(committed, (passage.follows for passage in self.pending)), dtype=bool)
        return self._follows

    @property
    def has_neighbours(self) -> bool:
        """Whether any row continues the previous row's document: else a neighbour weight ranks as 0 does."""
        return bool(self.follows[1:].any())

    def extend_follows(self, passages: Sequence) -> None:
        """Rows added: their passages' follows, where the index's have been read."""
        if self._follows is not None:
            self._follows = np.concatenate([self._follows, np.array([p.follows for p in passages], dtype=bool)])

    def neighbour_mix(self, neighbour_weight: float | None = None) -> NeighbourMix | None:
        """The final score's mix with each row's best neighbour's at `neighbour_weight` (None: the index's); None at
        0 or where no row follows another, so a search ranks as without neighbours, by the same code."""
        weight = self.neighbour_weight if neighbour_weight is None else neighbour_weight
        if not weight or not self.has_neighbours:
            return None
        return NeighbourMix(self.follows, weight)


def check_dense_weight(dense_weight) -> float | None:
    """A user's dense weight (0..1, validation.BOUNDS), None kept; below 1 bm25s must be installed.

    Raises UsageError for a weight outside 0..1 or not a number, ValueError naming the install for bm25s.
    """
    dense_weight = check_weight("dense_weight", dense_weight)
    if dense_weight is not None and dense_weight < 1.0:
        require_bm25s()
    return dense_weight


def pool_size(top_k: int, count: int) -> int:
    """Candidates per side of a pooled hybrid search: POOL_SIZE whatever top_k up to it, so the ranking of a
    query's first hits is the same at every top_k (more only when more hits are asked for)."""
    return min(count, max(POOL_SIZE, top_k))


def hybrid_top_k(faiss_index: faiss.Index, kind: str, searcher: faiss.Index, bm25, vectors: np.ndarray,
                 texts: Sequence[str], top_k: int, dense_weight: float, exclude: Sequence | None = None,
                 mix=None, neighbours: NeighbourMix | None = None) -> Ranked:
    """The top_k rows of each query by fused score (see the module doc for which rows are scored).

    vectors: the queries' vectors (queries, dim), texts: the same queries' texts; bm25: a
    bm25_index over the index's passages in row order; searcher: the index to search (ann.gpu_replica's or
    faiss_index itself). exclude[q]: rows (an array, or None) query q never ranks, `fuse`'s exclude: score
    -inf, set no bound of the normalisation (`index weight --tune` leaves out a query's own passage, as BEIR).
    mix: a sentence_vectors.SentenceMix making the dense side the mixed score, or None (the cosine alone).
    neighbours: the fused score mixed with each row's best neighbour's (`NeighbourMix`), or None.
    """
    count = int(faiss_index.ntotal)
    k = min(top_k, count)
    exclude = exclude if exclude is not None else [None] * len(vectors)
    if kind == "flat" and count <= EXACT_HYBRID_UP_TO:
        per_block = [fused_top_k(dense, bm25_query_scores(bm25, texts[part]), dense_weight, k, exclude[part],
                                 neighbours)
                     for part, dense in every_row_dense(faiss_index, vectors, mix)]
        return Ranked(*(np.concatenate(part) for part in zip(*per_block)))
    size = pool_size(top_k, count)
    _, dense_rows = searcher.search(vectors, size)
    per_query = [pooled_top_k(faiss_index, kind, vector, bm25_query_scores(bm25, [text])[0], rows, size, k,
                              dense_weight, left, mix, neighbours)
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
                 size: int, k: int, dense_weight: float, exclude: np.ndarray | None = None, mix=None,
                 neighbours: NeighbourMix | None = None) -> Ranked:
    """One query's top k over its pool: its dense rows (FAISS's top `size`) and BM25's top `size` rows, joined by
    their neighbours where the ranking mixes them in.

    lexical: (rows,) the query's BM25 score of every row. Rows of BM25 score 0 join only as dense rows.
    exclude: rows never ranked (hybrid_top_k), or None. mix, neighbours: as hybrid_top_k's.
    """
    lexical_rows = np.argpartition(-lexical, size - 1)[:size] if size < len(lexical) else np.arange(len(lexical))
    pool = np.union1d(dense_rows[dense_rows >= 0], lexical_rows[lexical[lexical_rows] > 0])
    pool = pool if neighbours is None else neighbours.pool(pool)
    dense = ann.stored_vectors(faiss_index, kind, pool) @ vector
    dense = dense if mix is None else mix.of_rows(vector, pool, dense)
    left = None if exclude is None else [np.flatnonzero(np.isin(pool, exclude))]  # by column of the pool
    ranked = fused_top_k(dense[None], lexical[pool][None], dense_weight, k, left, neighbours, pool)
    ranked = ranked._replace(rows=pool[ranked.rows])
    missing = k - len(pool)  # an ivf search short of `size` rows, and few rows sharing a word with the query
    if missing > 0:  # rows -1, as FAISS pads
        ranked = Ranked(*(np.pad(part, ((0, 0), (0, missing)), constant_values=-1 if part.dtype.kind == "i" else np.nan)
                          for part in ranked))
    return ranked


def fused_top_k(dense: np.ndarray, lexical: np.ndarray, dense_weight: float, k: int,
                exclude: Sequence | None = None, neighbours: NeighbourMix | None = None,
                rows: np.ndarray | None = None) -> Ranked:
    """The top k columns of `fuse(dense, lexical, dense_weight, exclude)`, (queries, candidates) in, per query;
    mixed with `neighbours` (or not: None) where the candidates are every row (rows None) or a pool's `rows`."""
    fused = fuse(dense, lexical, dense_weight, exclude)
    fused = fused if neighbours is None else neighbours.mixed(fused, rows)
    columns = top_k(fused, k)
    return Ranked(columns, *(np.take_along_axis(part, columns, 1) for part in (fused, dense, lexical)))
