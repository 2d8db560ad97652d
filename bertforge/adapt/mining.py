"""Hard negatives for ICT: for each (passage, sentence), a passage BM25 ranks high for the sentence that is
not the sentence's own.

In-batch negatives are mostly easy (another chapter, another drug); a passage sharing the
sentence's rare words is what teaches the encoder to read past word overlap. The negative is
drawn from the top `depth` hits other than the true passage (not always the first: the very
top hit is the likeliest to be a second true answer, a passage saying the same thing).
"""
from __future__ import annotations

import numpy as np

from ..tasks.retrieval.baselines import bm25_index, bm25_tokens
from .corpus import Passage
from .ict import query_candidates


def bm25_negatives(corpus: list[Passage], texts: list[str], examples: list[int], rng: np.random.Generator,
                   depth: int = 5) -> dict[int, dict[int, int]]:
    """{passage index: {sentence index: negative passage index}} for every query sentence of `examples`.

    texts: the corpus as indexed (what BM25 ranks); corpus[i].sentences are the query candidates.
    """
    index = bm25_index(texts)
    keys = [(p, s) for p in examples for s in query_candidates(corpus[p])]
    queries = [corpus[p].sentences[s] for p, s in keys]
    k = min(depth + 1, len(texts))
    hits, _ = index.retrieve(bm25_tokens(queries), k=k, show_progress=False, n_threads=1)
    negatives: dict[int, dict[int, int]] = {}
    for (passage, sentence), row in zip(keys, hits):
        others = [int(hit) for hit in row if int(hit) != passage][:depth]
        if not others:  # a one-passage corpus: nothing to contrast with but the others in the batch
            others = [(passage + 1) % len(texts)]
        negatives.setdefault(passage, {})[sentence] = int(rng.choice(others))
    return negatives
