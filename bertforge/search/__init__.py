"""Vector search over texts embedded by a BERT model: `Index` (build/add/search/save/load), streaming
builds (`build_index`, `add_corpus`) and cross-encoder re-ranking (`Reranker`). FAISS underneath.

Names are imported on first use, so that `bertforge` commands that do not search never need faiss.
"""
import importlib
from typing import Literal

# flat: exact inner product; ivf: inverted lists (k-means); hnsw: a graph; auto: flat up to
# ann.EXACT_UP_TO vectors, ivf above. Here, not in ann.py, so the command line needs no faiss.
IndexKind = Literal["auto", "flat", "ivf", "hnsw"]

_EXPORTS = {"Index": "index", "Hit": "index", "build_index": "build", "add_corpus": "build", "Reranker": "rerank"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
