"""What the server needs from a vector index, and where `--index DIR` comes from.

The server codes against `SearchIndex`, the shape of `bertforge.search.Index`: texts in, per
query the top-k hits (each with .id, .text, .score, and .dense_score / .lexical_score in a hybrid
search), best first, and its default dense weight.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Protocol

from ..errors import UsageError
from .errors import ApiError
from .inputs import too_long, which
from .settings import ServeSettings


class SearchIndex(Protocol):
    dense_weight: float  # the default ranking: below 1 fused with BM25 (GET /info shows it)
    sentence_weight: float  # above 0 each passage's best sentence mixed into the dense score (GET /info shows it)
    neighbour_weight: float  # above 0 each passage's best neighbour's score mixed into its own (GET /info shows it)

    def search(self, queries: list[str], top_k: int, *, dense_weight: float | None = None,
               sentence_weight: float | None = None, neighbour_weight: float | None = None) -> list[list]:
        """Per query, up to top_k `bertforge.search.Hit`s, best first (a weight None: the index's own)."""

    @property
    def embedder(self):
        """The index's own model (`bertforge.Embedder`: max_length, token_count, encode), maybe not --model."""

    def rank(self, vectors, texts: list[str], top_k: int, dense_weight: float, exclude=None,
             sentence_weight: float | None = None, neighbour_weight: float | None = None):
        """`search` on query vectors already made (with their texts, for BM25); `hits` reads the rows."""

    def hits(self, ranked) -> list[list]:
        """`rank`'s rows -> per query the Hits, as `search` returns them."""


def search_within(index: SearchIndex, queries: list[str], top_k: int, dense_weight: float | None,
                  settings: ServeSettings, truncate: bool, sentence_weight: float | None = None,
                  neighbour_weight: float | None = None) -> list[list]:
    """`index.search` under the rule of every route: a query longer than the index model's limit, or
    --max-input-length where given (`ServeSettings.input_limit`; its tokens as that model reads it: prompt, [CLS],
    [SEP]), is TEI's 422 unless `truncate`, and then cut there; the passages' vectors are unchanged, BM25 reads the
    whole query. Runs on the model thread (the index's model may load here, and its tokenizer is that thread's),
    in one trip: counting and searching. A weight the index cannot rank by (a sentence_weight above 0 on an index
    without sentence vectors: a UsageError) is the request's mistake, 422."""
    try:
        embedder = index.embedder
        limit = settings.input_limit(embedder.max_length)
        over = next(((i, n) for i, n in enumerate(map(embedder.token_count, queries)) if n > limit), None)
        if over is not None and not truncate:
            raise too_long(over[1], limit, which(over[0], len(queries)))
        if over is None or limit == embedder.max_length:  # within it, or cut where `Index.search` cuts
            return index.search(queries, top_k, dense_weight=dense_weight, sentence_weight=sentence_weight,
                                neighbour_weight=neighbour_weight)
        shorter = copy.copy(embedder)  # the same model and tokenizer, cutting earlier; the index's own is untouched
        shorter.max_length = limit
        weight = index.dense_weight if dense_weight is None else dense_weight
        return index.hits(index.rank(shorter.encode(queries), queries, top_k, weight, None, sentence_weight,
                                     neighbour_weight))
    except UsageError as error:  # the request asked for what this index cannot do
        raise ApiError(422, "validation", str(error)) from None
    except ValueError as error:  # the server's index cannot run (bm25s missing, its model folder gone): not the input
        raise ApiError(424, "backend", str(error)) from None


def load_index(folder: str, device: str | None = None) -> SearchIndex:
    """`bertforge.search.Index.load(folder)`, its queries embedded on `device` (the served models' device: auto
    when None); ValueError when the folder or the search package is missing.

    An index that searches hybrid by default builds its BM25 here, before the first request waits
    for it (and a missing bm25s fails the start, not the first search); one that ranks with neighbours reads which
    passages follow which here too.
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
    if index.neighbour_weight > 0:
        index.neighbour_mix()  # reads which passages follow which now, not in the first request
    return index
