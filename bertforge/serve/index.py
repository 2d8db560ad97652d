"""What the server needs from a vector index, and where `--index DIR` comes from.

The server codes against `SearchIndex` (the shape of `bertforge.search.Index`): texts
in, per query the top-k (id, text, score). `ExactIndex` is a small in-memory one (an
inner product over every vector, exact by construction) for tests, the explorer's
screenshot and the benchmark; folders on disk are `bertforge.search.Index`'s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

Hit = tuple[str, str, float]  # (id, text, score)


class SearchIndex(Protocol):
    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        """Per query, up to top_k hits, best first."""


class ExactIndex:
    """Texts and their vectors in memory; a query is embedded with `embed` and scored against all.

    embed: texts -> float32 (n, dim), the same function for the corpus and the queries
    (normalised vectors make the scores cosines).
    """

    def __init__(self, texts: Sequence[str], embed, ids: Sequence[str] | None = None):
        if not texts:
            raise ValueError("the index needs at least one text")
        self.texts = list(texts)
        self.ids = [str(i) for i in ids] if ids is not None else [str(i) for i in range(len(self.texts))]
        if len(self.ids) != len(self.texts):
            raise ValueError(f"{len(self.ids)} ids for {len(self.texts)} texts; give one id per text")
        self.embed = embed
        self.vectors = np.asarray(embed(self.texts), dtype=np.float32)  # (n, dim)

    def __len__(self) -> int:
        return len(self.texts)

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        scores = np.asarray(self.embed(queries), dtype=np.float32) @ self.vectors.T  # (queries, n)
        top_k = min(top_k, len(self.texts))
        results = []
        for row in scores:
            best = np.argsort(-row, kind="stable")[:top_k]
            results.append([(self.ids[i], self.texts[i], float(row[i])) for i in best])
        return results


def load_index(folder: str) -> SearchIndex:
    """`bertforge.search.Index.load(folder)`; ValueError when the folder or the search package is missing."""
    if not Path(folder).is_dir():
        raise ValueError(f"--index {folder} is not a folder; build one with `bertforge index build`")
    try:
        from bertforge.search import Index
    except ImportError:
        raise ValueError("--index needs bertforge.search (the vector index package), which this installation "
                         "does not have") from None
    return Index.load(folder)
