"""Query-time pseudo-relevance feedback on a BEIR folder's real queries: each query vector moved towards the mean of
its top k passages (Rocchio, weight alpha), ranked alone and fused with BM25, beside the model and the index.

    python scripts/dense_feedback.py runs/retrieval/python-faq minilm
    python scripts/dense_feedback.py runs/retrieval/python-faq DIR/model

Measured on Python's FAQ (docs/adapt.md): fused again it lowers what the index serves.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from bertforge.adapt.evaluation import read_beir_folder
from bertforge.embeddings.embed import Embedder
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.hybrid import fuse
from bertforge.tasks.retrieval.metrics import retrieval_metrics

DENSE_WEIGHT = 0.7  # the index's weight on both corpora adapt was measured on


def main(beir: str, model: str) -> None:
    torch.set_num_threads(2)
    data = read_beir_folder(beir)
    embedder = Embedder.from_pretrained(resolve_model(model), progress=False)
    passages, queries = embedder.encode(list(data.corpus)), embedder.encode(list(data.queries))
    position = {passage_id: n for n, passage_id in enumerate(data.corpus_ids)}
    relevant = [[position[p] for p in data.relevant[q]] for q in data.query_ids]
    lexical = bm25_scores(list(data.queries), list(data.corpus))

    def ndcg(scores: np.ndarray) -> float:
        return retrieval_metrics(scores, relevant)["ndcg@10"]

    dense = queries @ passages.T
    print(f"{model} on {beir}: model {ndcg(dense):.4f}, BM25 {ndcg(lexical):.4f}, "
          f"index (fused {DENSE_WEIGHT}) {ndcg(fuse(dense, lexical, DENSE_WEIGHT)):.4f}")
    print("| top k | alpha | fed back from | model alone | fused |\n|---|---|---|---|---|")
    for k in (1, 3, 5):
        for alpha in (0.3, 0.5, 1.0):
            for source in ("model", "index"):
                first = dense if source == "model" else fuse(dense, lexical, DENSE_WEIGHT)
                top = np.argsort(-first, axis=1)[:, :k]
                moved = queries + alpha * passages[top].mean(axis=1)
                moved /= np.linalg.norm(moved, axis=1, keepdims=True)
                again = moved @ passages.T
                print(f"| {k} | {alpha} | {source} | {ndcg(again):.4f} | "
                      f"{ndcg(fuse(again, lexical, DENSE_WEIGHT)):.4f} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
