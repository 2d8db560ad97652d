"""A passage scored with its neighbours: the passages next to it in the same document.

A passage is read in its context. A novel's paragraph of dialogue continues the scene of the one before it; a
manual's paragraph continues its section. A query about that scene or section matches the passage's neighbours too,
so the score of a passage can mix in its best neighbour's:

    score'(q, p) = (1 - n) * score(q, p) + n * max(score(q, p - 1), score(q, p + 1))

over the neighbours in p's own document (none: its own score), n the neighbour weight (0: the passage alone).
`score` is what the engine ranks by before it: the fused score of the passage's vectors and BM25 (hybrid.py,
sentences.py). Which passages are neighbours is the corpus reader's to say (`follows`, one flag per passage in
corpus order: it continues the previous passage's document): a plain-text or markup file's passages follow one
another, the parts of a record split for length follow one another, and the records of a .jsonl or table (a review,
a tweet, a BEIR document) are documents of their own, so a corpus of records has no neighbours and n changes
nothing there.

Measured offline first (2026-11-28, adapt's held-out ICT queries, the dev best over n in NEIGHBOUR_WEIGHTS and the
sentence and dense weights, nDCG@10 dev / test): *Emma*'s adapted model 0.131 / 0.142 -> 0.157 / 0.162, the base
all-MiniLM-L6-v2 0.111 / 0.121 -> 0.131 / 0.136; on drug reviews, whose rows are separate reviews, mixing in the
next row's score lowered every score (the real queries 0.305 -> 0.265 at n 0.3): which is why records do not
follow one another. `neighbour_mixed` is the one place the rule lives: adapt measures and picks n with it, the
search index ranks with it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NEIGHBOUR_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # the grid adapt picks from on its dev queries


def best_neighbour(scores: np.ndarray, follows: np.ndarray) -> np.ndarray:
    """(queries, rows): each row's best neighbour's score, rows in corpus order, follows[i] whether row i continues
    row i - 1's document. A row with no neighbour (or only left-out ones, scored -inf) gets its own score."""
    follows = np.asarray(follows, dtype=bool)
    left = np.full_like(scores, -np.inf)
    right = np.full_like(scores, -np.inf)
    left[:, 1:] = np.where(follows[1:], scores[:, :-1], -np.inf)
    right[:, :-1] = np.where(follows[1:], scores[:, 1:], -np.inf)
    best = np.maximum(left, right)
    return np.where(np.isneginf(best), scores, best)


def neighbour_mixed(scores: np.ndarray, follows: np.ndarray | None, neighbour_weight: float) -> np.ndarray:
    """(1 - n) * scores + n * best_neighbour(scores): (queries, rows) scores of rows in corpus order. At n = 0, or
    where no row follows another (follows None or all False), the scores as they are. A left-out row (-inf) stays
    -inf and is no row's neighbour."""
    if neighbour_weight == 0 or follows is None or not np.any(follows):
        return scores
    scores = np.asarray(scores, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # -inf * (1 - n) + n * -inf is -inf, never nan: n is in (0, 1)
        return (1 - neighbour_weight) * scores + neighbour_weight * best_neighbour(scores, follows)


def continuing(follows: Sequence[bool] | np.ndarray, rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """(len(rows),) follows for a subset of rows (ascending row numbers): whether each continues the document of
    the row before it in the subset, i.e. it is the next row of the corpus and follows it there."""
    rows = np.asarray(rows, dtype=np.int64)
    follows = np.asarray(follows, dtype=bool)
    result = np.zeros(len(rows), dtype=bool)
    if len(rows) > 1:
        result[1:] = (np.diff(rows) == 1) & follows[rows[1:]]
    return result


def with_neighbours(rows: np.ndarray, follows: np.ndarray) -> np.ndarray:
    """rows (a pool of row numbers) joined by each one's neighbours in its document, ascending and unique: the rows
    a pool must score for `neighbour_mixed` to see every pooled row's neighbours."""
    rows = np.asarray(rows, dtype=np.int64)
    follows = np.asarray(follows, dtype=bool)
    before = rows[(rows > 0) & follows[np.minimum(rows, len(follows) - 1)]] - 1
    after = rows + 1
    after = after[after < len(follows)]
    after = after[follows[after]]
    return np.union1d(rows, np.concatenate([before, after]))
