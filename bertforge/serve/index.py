"""What the server needs from a vector index, and where `--index DIR` comes from.

The server codes against `SearchIndex`, the shape of `bertforge.search.Index`: texts in, per
query the top-k hits (each with .id, .text, .score, and .dense_score / .lexical_score in a hybrid
search), best first, and its default dense weight.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class SearchIndex(Protocol):
    dense_weight: float  # the default ranking: below 1 fused with BM25 (GET /info shows it)

    def search(self, queries: list[str], top_k: int, *, dense_weight: float | None = None) -> list[list]:
        """Per query, up to top_k `bertforge.search.Hit`s, best first (dense_weight None: the index's own)."""


def load_index(folder: str, device: str | None = None) -> SearchIndex:
    """`bertforge.search.Index.load(folder)`, its queries embedded on `device` (the served models' device: auto
    when None); ValueError when the folder or the search package is missing.

    An index that searches hybrid by default builds its BM25 here, before the first request waits
    for it (and a missing bm25s fails the start, not the first search).
    """
    if not Path(folder).is_dir():
        raise ValueError(f"--index {folder} is not a folder; build one with `bertforge index build`")
    try:
        from bertforge.search import Index
    except ImportError:
        raise ValueError("--index needs bertforge.search and faiss (pip install 'bertforge[search]'), which this "
                         "installation does not have") from None
    index = Index.load(folder, device=device)
    if index.dense_weight < 1.0:
        index.bm25()
    return index
