"""Re-rank search hits with a cross-encoder: a BertForSequenceClassification that reads (query, passage) together.

A bi-encoder index compares two vectors made apart; a cross-encoder attends across the query
and the passage, so it ranks better but costs a forward pass per pair: it re-orders the few
hits the index found, never the whole corpus. Train one with `bertforge finetune` on a
CSV/TSV/JSONL of query, passage and label columns (two text columns make a pair task): a
label of 1/relevant for a matching pair, 0 for a non-matching one; or a regression score.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..tasks.finetune import load_for_prediction
from ..tasks.classification.task import ClassificationTask
from .index import Hit

# Label names taken to mean "this passage answers the query", in the order they are looked for.
RELEVANT_NAMES = ("1", "relevant", "positive", "true", "yes", "match")


class Reranker:
    """Scores (query, passage) pairs with a fine-tuned cross-encoder folder and re-orders hits by them.

    relevant_label: for a classifier, the label whose probability is the score (default: a
    label named as in RELEVANT_NAMES, else the last one); a regression model's output is the
    score as it is. Raises ValueError for a folder that is not a sequence classifier trained
    on text pairs, or a relevant_label it does not have.
    """

    def __init__(self, folder: str | Path, relevant_label: str | None = None, batch_size: int = 32,
                 device: str | torch.device = "cpu"):
        task, self.model = load_for_prediction(folder, pair=True)  # a cross-encoder without task.json: a pair
        if not isinstance(task, ClassificationTask) or len(task.settings.text_columns) != 2:
            raise ValueError(f"{folder} is not a cross-encoder: a re-ranker is a sequence-classification model "
                             "fine-tuned on (query, passage) pairs (two text columns) with `bertforge finetune`")
        self.task, self.batch_size, self.device = task, batch_size, torch.device(device)
        self.model.to(self.device)
        labels, problem_type = task.labels.labels, task.labels.problem_type
        if problem_type == "multi_label_classification":
            raise ValueError(f"{folder} is a multi-label classifier; a re-ranker needs one relevance label or score")
        self.column = None if problem_type == "regression" else relevant_column(labels, relevant_label, folder)

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """Relevance of each passage to the query: float (len(passages),), higher is more relevant."""
        if not passages:
            return np.zeros(0, dtype=np.float32)
        pairs = [(query, passage) for passage in passages]
        windows = self.task.windows(pairs)
        scores = self.task.document_scores(self.model, windows, self.batch_size, self.device)
        return np.asarray(scores if self.column is None else scores[:, self.column], dtype=np.float32)

    def rerank(self, query: str, hits: Sequence[Hit]) -> list[Hit]:
        """The hits re-ordered by the cross-encoder's score (kept in `rerank_score`), best first."""
        scores = self.scores(query, [hit.text for hit in hits])
        for hit, score in zip(hits, scores):
            hit.rerank_score = float(score)
        return sorted(hits, key=lambda hit: -hit.rerank_score)


def relevant_column(labels: list[str], relevant_label: str | None, folder) -> int:
    if relevant_label is not None:
        if relevant_label not in labels:
            raise ValueError(f"relevant_label {relevant_label!r} is not a label of {folder}; it has {labels}")
        return labels.index(relevant_label)
    for name in RELEVANT_NAMES:
        for column, label in enumerate(labels):
            if label.lower() == name:
                return column
    return len(labels) - 1
