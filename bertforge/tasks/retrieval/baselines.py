"""Lexical baselines for the retrieval table: BM25 (bm25s) and TF-IDF cosine (scikit-learn).

Both are scorers in `evaluation.py`'s sense: (queries, documents) -> (queries, documents) scores.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np


def require_bm25s():
    """The bm25s module, or ValueError saying how to install it (an optional extra)."""
    try:
        import bm25s
    except ImportError:
        raise ValueError("BM25 (the lexical baseline, hybrid search) needs bm25s: "
                         "pip install 'bertforge[retrieval]'") from None
    return bm25s


def bm25_index(documents: Sequence[str]):
    """A bm25s index of `documents`: Okapi BM25 (k1 1.5, b 0.75, bm25s' defaults), English stop words removed."""
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
    """`texts` tokenised as bm25_index tokenises its documents (bm25s is imported by then)."""
    import bm25s

    return bm25s.tokenize(list(texts), stopwords="en", return_ids=return_ids, show_progress=False)


def bm25_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """(queries, documents) BM25 scores (see bm25_index)."""
    return bm25_query_scores(bm25_index(documents), queries)


def bm25_query_scores(index, queries: Sequence[str]) -> np.ndarray:
    """(queries, documents) BM25 scores of `queries` against a bm25_index's documents, in their order.

    A query left with no token (only stop words or one-letter words) scores 0 everywhere (bm25s raises on it).
    """
    return np.stack([index.get_scores(query) if query else np.zeros(index.scores["num_docs"])
                     for query in bm25_tokens(queries, return_ids=False)]).astype(np.float32)


def tfidf_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """Cosine of sublinear TF-IDF vectors of words and word bigrams, fitted on the documents."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1, stop_words="english")
    document_vectors = vectorizer.fit_transform(documents)  # rows are L2-normalised: a dot product is the cosine
    return (vectorizer.transform(queries) @ document_vectors.T).toarray().astype(np.float32)


BASELINES = {"bm25": bm25_scores, "tfidf": tfidf_scores}
