"""Hybrid retrieval: a sentence encoder's cosines and BM25's scores fused into one ranking.

Lexical and dense retrieval miss different things (a rare name, a drug, a character is BM25's;
a paraphrase is the encoder's), so a convex combination of the two, each min-max normalised per
query over the same candidates, ranks better than either (Bruch et al. 2022, "An Analysis of
Fusion Functions for Hybrid Retrieval": convex combination beats reciprocal-rank fusion and is
robust to its weight). On drug reviews with all-MiniLM-L6-v2 and no training: held-out ICT test
nDCG@10 0.099 (dense) and 0.154 (BM25) -> 0.183 fused at weight 0.7 (scripts/results/adapt_hybrid.md); the
real review-to-review queries 0.296 and 0.147 -> 0.310 at 0.9, each query's own review left out before
normalising (2026-11-28; the 0.306 at 0.7 there, and 0.311 at 0.5 since, had it inside: see `fuse`).

The weight is the dense share: 1 is the encoder alone, 0 BM25 alone. `fuse` is the one place the
fusion rule lives: the search index ranks with it and adapt measures and picks the weight with it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...validation import checked
from .evaluation import Scorer
from .metrics import left_out

WEIGHTS = tuple(round(0.1 * step, 1) for step in range(11))  # the grid a weight is picked from


def best_weight(scores: Mapping[float, float]) -> float:
    """The weight of the highest score ({weight: score}, e.g. nDCG@10 per weight of WEIGHTS); ties go to the larger
    weight, so a tie with 1 keeps the encoder alone (no BM25 to build or serve). adapt picks its index's weight by
    this rule, `bertforge index weight --tune` an existing index's."""
    return max(scores, key=lambda weight: (scores[weight], weight))


def min_max(scores: np.ndarray) -> np.ndarray:
    """Each row scaled to [0, 1] over its own columns; a row of equal scores becomes all zeros.

    A -inf column (left out: `metrics.left_out`) stays -inf and sets neither bound, so a row scales as it would
    without that column.
    """
    low, high = scores.min(axis=-1, keepdims=True), scores.max(axis=-1, keepdims=True)
    if np.isneginf(low).any():  # bounds again without the -inf columns, only then: a masked pass costs 3x
        kept = ~np.isneginf(scores)
        low = np.min(scores, axis=-1, keepdims=True, where=kept, initial=np.inf)
        high = np.max(scores, axis=-1, keepdims=True, where=kept, initial=-np.inf)
    return (scores - low) / np.maximum(high - low, 1e-12)  # -inf stays -inf, a row of only -inf too (low +inf)


def fuse(dense: np.ndarray, lexical: np.ndarray, dense_weight: float,
         exclude: Sequence | None = None) -> np.ndarray:
    """(queries, candidates) fused scores: dense_weight * min_max(dense) + (1 - dense_weight) * min_max(lexical).

    Both arrays score the same candidates in the same column order; normalising over those
    candidates makes cosines (~0.1-0.9) and BM25 scores (0-40) comparable per query.
    exclude[q]: the candidate(s) never ranked for query q (`metrics.left_out`'s rule: BEIR's query that is also a
    document), or None. They score -inf and are left out before normalising: a query's own review scores cosine
    ~1 and the top BM25 score, and as both maxima it squashed the BM25 side of every other candidate (drug
    reviews, MiniLM, weight 0.5: nDCG@10 0.311 with it, 0.266 fused over the candidates actually ranked).
    """
    dense_weight = checked("dense_weight", dense_weight, float)  # validation.BOUNDS: 0..1, as search checks it
    dense, lexical = np.asarray(dense, dtype=np.float32), np.asarray(lexical, dtype=np.float32)
    if exclude is not None:  # on copies: a remembered scorer's matrix is fused again at the next weight
        dense, lexical = left_out(dense.copy(), exclude), left_out(lexical.copy(), exclude)
    with np.errstate(invalid="ignore"):  # 0 * -inf in a left-out cell at weight 0 or 1: -inf again below
        fused = dense_weight * min_max(dense) + (1.0 - dense_weight) * min_max(lexical)
    return left_out(fused, exclude)


def hybrid_scorer(dense: Scorer, lexical: Scorer, dense_weight: float) -> Scorer:
    """A scorer (tasks.retrieval.evaluation) ranking by `fuse` of two scorers over the whole document list.

    It takes `exclude` (evaluate_retrieval passes each query's own document), for `fuse` to leave out before
    normalising: the metrics dropping it from the fused ranking afterwards is too late.
    """

    def scores(queries: Sequence[str], documents: Sequence[str], exclude: Sequence | None = None) -> np.ndarray:
        return fuse(dense(queries, documents), lexical(queries, documents), dense_weight, exclude)

    scores.takes_exclude = True  # type: ignore[attr-defined]  # what evaluate_retrieval looks for
    return scores


def remembered(scorer: Scorer) -> Scorer:
    """`scorer`, computed once per distinct (queries, documents): picking a weight scores the same texts
    once per weight, and an encoder should embed them once."""
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}

    def scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        key = (tuple(queries), tuple(documents))
        if key not in cache:
            cache[key] = scorer(queries, documents)
        return cache[key]

    return scores
