"""Lexical baselines for the retrieval table: BM25 (bm25s) and TF-IDF cosine (scikit-learn).

Both are scorers in `evaluation.py`'s sense: (queries, documents) -> (queries, documents) scores.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np


def bm25_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """Okapi BM25 (k1 1.5, b 0.75, bm25s' defaults) with English stop words removed."""
    try:
        import bm25s
    except ImportError:
        raise ValueError("the BM25 baseline needs bm25s: pip install 'bertforge[retrieval]'") from None
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each index build at DEBUG
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(documents), stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    return np.stack([index.get_scores(query) for query in tokens]).astype(np.float32)


def tfidf_scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
    """Cosine of sublinear TF-IDF vectors of words and word bigrams, fitted on the documents."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1, stop_words="english")
    document_vectors = vectorizer.fit_transform(documents)  # rows are L2-normalised: a dot product is the cosine
    return (vectorizer.transform(queries) @ document_vectors.T).toarray().astype(np.float32)


BASELINES = {"bm25": bm25_scores, "tfidf": tfidf_scores}
