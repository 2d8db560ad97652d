"""Score a text encoder (or a lexical baseline) on a retrieval set or on scored pairs.

A scorer is any function (queries, documents) -> (queries, documents) similarity matrix:
a sentence encoder's cosines (`encoder_scorer`), BM25 or TF-IDF (`baselines.py`). The same
metrics then apply to all of them, so the results table compares like with like.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...embeddings.embed import Embedder
from ...embeddings.folder_vectors import folder_options
from ...embeddings.similarity import l2_normalized
from .metrics import RECALL_AT, relevant_indices, retrieval_metrics, spearman
from .reader import RetrievalSet, SentencePairs

Scorer = Callable[[Sequence[str], Sequence[str]], np.ndarray]


def encoder_embedder(model, tokenizer, batch_size: int = 64, progress: bool | None = None) -> Embedder:
    """An Embedder that gives a BiEncoder's vectors: the options `embed` takes from the folder the model was read
    from (pooling, normalisation, truncation, default prompt), which the model carries. tokenizer: the folder's
    (`tokenization.folder.load_tokenizer`)."""
    return Embedder(model.bert, tokenizer, **folder_options(model), batch_size=batch_size, progress=progress)


def encoder_scorer(embedder: Embedder | RememberedVectors) -> Scorer:
    """Cosine similarity of the embedder's vectors."""

    def scores(queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        return l2_normalized(embedder.encode(list(queries))) @ l2_normalized(embedder.encode(list(documents))).T

    return scores


class RememberedVectors:
    """An embedder that embeds each distinct text once, however many evaluation sets hold it: a corpus adapted on
    and given again as the `--eval` folder's corpus shares most passages with the held-out ones (Python's FAQ:
    694 of the BEIR corpus's 1,435). For one model state: make a new one after the model changes."""

    def __init__(self, embedder: Embedder):
        self.embedder, self.vectors = embedder, {}

    def encode(self, texts: list[str]) -> np.ndarray:
        # Keyed by the words: WordPiece splits on whitespace first, so runs of it never change the tokens, and a
        # corpus adapt read (whitespace normalised) meets the same passages raw in a BEIR file.
        keys = [" ".join(text.split()) for text in texts]
        new = [key for key in dict.fromkeys(keys) if key not in self.vectors]
        if new:
            self.vectors.update(zip(new, self.embedder.encode(new)))
        if not texts:
            return self.embedder.encode([])
        return np.stack([self.vectors[key] for key in keys])


def evaluate_retrieval(scorer: Scorer, retrieval_set: RetrievalSet,
                       recall_at: Sequence[int] = RECALL_AT) -> dict[str, float]:
    """recall@k (k in recall_at: 1 and 10 by default), mrr@10, ndcg@10 over the set's queries.

    A query that is also in the corpus (same id) never retrieves itself, as in BEIR. A scorer that normalises each
    query's scores over the documents (`hybrid.hybrid_scorer`: its `takes_exclude`) is given those documents to
    leave out first, so the ranking is the one over the documents ranked (BEIR drops the id only after scoring,
    which changes nothing for a scorer that scores each document alone).
    """
    position = {doc_id: index for index, doc_id in enumerate(retrieval_set.corpus_ids)}
    exclude = [position.get(query_id) for query_id in retrieval_set.query_ids]
    excluding = {"exclude": exclude} if getattr(scorer, "takes_exclude", False) else {}
    scores = scorer(retrieval_set.queries, retrieval_set.corpus, **excluding)
    relevant = relevant_indices(retrieval_set.query_ids, retrieval_set.corpus_ids, retrieval_set.relevant)
    return retrieval_metrics(scores, relevant, exclude=exclude, recall_at=recall_at)


def evaluate_scored_pairs(embedder: Embedder, pairs: SentencePairs) -> dict[str, float]:
    """Spearman correlation of the pairs' cosines with their gold scores."""
    first, second = l2_normalized(embedder.encode(pairs.anchors)), l2_normalized(embedder.encode(pairs.positives))
    return {"spearman": spearman((first * second).sum(axis=1), pairs.scores)}
