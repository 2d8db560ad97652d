"""Lexical baselines for the retrieval table: BM25 (bm25s) and TF-IDF cosine (scikit-learn).

Both are scorers in `evaluation.py`'s sense: (queries, documents) -> (queries, documents) scores.
"""
from __future__ import annotations

import functools
import logging
import math
import os
import sys
from collections import Counter
from collections.abc import Sequence

import numpy as np


# What BM25 is here, in words: part of adapt's stage keys (a change reruns the stages it scored) and its report.
# Stemming (Snowball English, as Anserini's BM25 stems by default) took the real questions of Python's FAQ from
# 0.455 to 0.488 nDCG@10 (MiniLM fused with it: 0.721 -> 0.748) and drug reviews' real queries 0.140 -> 0.147,
# with the held-out ICT queries level within their noise (scripts/results/adapt_hybrid.md).
BM25_ANALYZER = "bm25s Okapi k1=1.5 b=0.75; English stop words; Snowball English stems"


def require_bm25s():
    """The bm25s module, or ValueError saying how to install it (an optional extra, with PyStemmer).

    Where JAX is installed, bm25s runs a JAX op as it is imported (to pick its top-k backend), and JAX with CUDA then
    takes 75% of the GPU's memory for itself: an adapt or a server on a GPU box that has JAX (Colab's have) would
    train and embed in the quarter left, and five adapt processes on one H200 ran out of memory. Unless the caller
    chose JAX's platform or JAX is already in use, it is kept on the CPU (bm25s' top-k is a few numbers a query).
    """
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import bm25s
        import Stemmer  # noqa: F401 (PyStemmer: the stems bm25_tokens uses)
    except ImportError as missing:
        raise ValueError(f"BM25 (the lexical baseline, hybrid search) needs {missing.name}: "
                         "pip install 'bertforge[retrieval]'") from None
    return bm25s


def bm25_index(documents: Sequence[str]):
    """A bm25s index of `documents` (BM25_ANALYZER: Okapi BM25 with bm25s' defaults, English stop words removed,
    words stemmed)."""
    bm25s = require_bm25s()
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each index build at DEBUG
    tokens = bm25_tokens(documents)
    if not tokens.vocab:  # bm25s fails on it with "max() arg is an empty sequence"
        raise ValueError(f"BM25 finds no word in the {len(documents)} documents (only stop words and one-letter "
                         "words); rank them by the encoder alone")
    index = bm25s.BM25()
    index.index(tokens, show_progress=False)
    return index


def bm25_tokens(texts: Sequence[str], return_ids: bool = True):
    """`texts` tokenised as bm25_index tokenises its documents: lower-cased words of 2+ letters, English stop
    words dropped, each word's Snowball stem."""
    return require_bm25s().tokenize(list(texts), stopwords="en", stemmer=english_stemmer(), return_ids=return_ids,
                          show_progress=False)


@functools.cache
def english_stemmer():
    """PyStemmer's Snowball English stemmer (C; its own cache of stemmed words), made once."""
    import Stemmer

    return Stemmer.Stemmer("english")


def bm25_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """(queries, documents) BM25 scores (see bm25_index)."""
    return bm25_query_scores(bm25_index(documents), queries)


def bm25_query_scores(index, queries: Sequence[str]) -> np.ndarray:
    """(queries, documents) BM25 scores of `queries` against a bm25_index's documents, in their order.

    A query left with no token (only stop words or one-letter words) scores 0 everywhere (bm25s raises on it).
    """
    return np.stack([index.get_scores(query) if query else np.zeros(index.scores["num_docs"])
                     for query in bm25_tokens(queries, return_ids=False)]).astype(np.float32)


class Bm25Statistics:
    """BM25 (BM25_ANALYZER, bm25s' Lucene variant) of any query against any text, with a corpus's word statistics.

    A bm25s index scores only its own documents; adapt's teacher term needs the scores of ICT's passages without
    their cut sentence, texts the index never held. `scores` gives what bm25s's `get_scores` would give a text with
    the corpus's document frequencies and mean length (equal on the corpus's own documents: tests).
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75, chunk: int = 10_000):
        require_bm25s()
        self.count, self.k1, self.b, self.frequency, length = 0, k1, b, Counter(), 0
        for start in range(0, len(documents), chunk):  # a big corpus's words are counted, not held
            for words in bm25_tokens(documents[start:start + chunk], return_ids=False):
                self.count, length = self.count + 1, length + len(words)
                self.frequency.update(set(words))
        self.mean_length = length / max(1, self.count)

    def idf(self, word: str) -> float:
        frequency = self.frequency.get(word, 0)
        return math.log(1 + (self.count - frequency + 0.5) / (frequency + 0.5))

    def scores(self, queries: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """(queries, texts) float32 scores; a word said twice in a query counts twice, as in bm25s."""
        query_words = bm25_tokens(queries, return_ids=False)
        out = np.zeros((len(query_words), len(texts)), dtype=np.float32)
        for column, words in enumerate(bm25_tokens(texts, return_ids=False)):
            counts, length = Counter(words), len(words)
            norm = self.k1 * (1 - self.b + self.b * length / max(self.mean_length, 1e-9))
            weights = {word: self.idf(word) * tf / (tf + norm) for word, tf in counts.items()}
            for row, query in enumerate(query_words):
                out[row, column] = sum(weights.get(word, 0.0) for word in query)
        return out


def tfidf_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """Cosine of sublinear TF-IDF vectors of words and word bigrams, fitted on the documents."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1, stop_words="english")
    document_vectors = vectorizer.fit_transform(documents)  # rows are L2-normalised: a dot product is the cosine
    return (vectorizer.transform(queries) @ document_vectors.T).toarray().astype(np.float32)


BASELINES = {"bm25": bm25_scores, "tfidf": tfidf_scores}
