"""Hard negatives for ICT: for each (passage, sentence), a passage BM25 ranks high for the sentence that is
not the sentence's own.

In-batch negatives are mostly easy (another chapter, another drug); a passage sharing the
sentence's rare words is what teaches the encoder to read past word overlap. The negative is
drawn from the top `depth` hits other than the true passage (not always the first: the very
top hit is the likeliest to be a second true answer, a passage saying the same thing).
The sentences are ranked a chunk at a time and the answers kept as one int32 per sentence, so
mining a big corpus holds no more than BM25's own index does.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..search.corpus import chunked
from ..tasks.retrieval.baselines import bm25_index, bm25_tokens
from ..search.documents import Passage
from .ict import query_candidates

CHUNK_SENTENCES = 20_000  # query sentences ranked per bm25s call


class HardNegatives:
    """The mined negative of every (passage, sentence): `of(passage, sentence)`, a corpus index.

    Kept flat: `first[p]` is where passage p's sentences start in `negative` (-1 for a sentence that is no
    query), rather than a dict per passage.
    """

    def __init__(self, first: np.ndarray, negative: np.ndarray):
        self.first, self.negative = first, negative

    def of(self, passage: int, sentence: int) -> int:
        found = int(self.negative[self.first[passage] + sentence])
        if found < 0:
            raise KeyError(f"sentence {sentence} of passage {passage} is no query: nothing was mined for it")
        return found


def bm25_negatives(corpus: Sequence[Passage], texts: Sequence[str], examples: list[int], rng: np.random.Generator,
                   depth: int = 5, chunk_sentences: int = CHUNK_SENTENCES) -> HardNegatives:
    """The negatives of every query sentence of `examples` (the draws do not depend on chunk_sentences).

    texts: the corpus as indexed (what BM25 ranks); corpus[i].sentences are the query candidates.
    """
    index = bm25_index(texts)
    first = np.zeros(len(corpus) + 1, dtype=np.int64)
    first[1:] = np.cumsum([len(passage.sentences) for passage in corpus])
    negative = np.full(int(first[-1]), -1, dtype=np.int32)
    k = min(depth + 1, len(texts))
    keys = ((p, s) for p in examples for s in query_candidates(corpus[p]))
    for chunk in chunked(keys, chunk_sentences):
        queries = [corpus[p].sentences[s] for p, s in chunk]
        hits, _ = index.retrieve(bm25_tokens(queries), k=k, show_progress=False, n_threads=1)
        for (passage, sentence), row in zip(chunk, hits):
            others = [int(hit) for hit in row if int(hit) != passage][:depth]
            if not others:  # a one-passage corpus: nothing to contrast with but the others in the batch
                others = [(passage + 1) % len(texts)]
            negative[first[passage] + sentence] = int(rng.choice(others))
    return HardNegatives(first, negative)
