"""What the server needs from a vector index, and where `--index DIR` comes from.

The server codes against `SearchIndex`, the shape of `bertforge.search.Index`: texts in, per
query the top-k hits (each with .id, .text, .score), best first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class SearchIndex(Protocol):
    def search(self, queries: list[str], top_k: int) -> list[list]:
        """Per query, up to top_k `bertforge.search.Hit`s, best first."""


def load_index(folder: str) -> SearchIndex:
    """`bertforge.search.Index.load(folder)`; ValueError when the folder or the search package is missing."""
    if not Path(folder).is_dir():
        raise ValueError(f"--index {folder} is not a folder; build one with `bertforge index build`")
    try:
        from bertforge.search import Index
    except ImportError:
        raise ValueError("--index needs bertforge.search and faiss (pip install 'bertforge[search]'), which this "
                         "installation does not have") from None
    return Index.load(folder)
