"""The baseline recipe: TF-IDF + logistic regression on the same files and splits as fine-tuning."""
from __future__ import annotations

import numpy as np

from ..baseline import join_pair, predict_probabilities, tfidf_logistic_regression
from ..data.labelled import LabelSpace, read_rows
from ..metrics import classification_metrics, multilabel_metrics, regression_metrics
from ..tasks import TaskSettings


def run_baseline(settings: TaskSettings, seed: int = 0) -> dict:
    """Fit on settings.train (C by 5-fold CV there), score on dev and test; returns {"dev": ..., "test": ...}."""
    if not settings.train:
        raise ValueError("no training file: set data.train")
    columns = {"text_columns": settings.text_columns, "label_column": settings.label_column}
    train = read_rows(settings.train, **columns)
    labels = LabelSpace.infer(train.labels, settings.problem_type or None, settings.label_separator)
    texts = [join_pair(row) for row in train.texts]
    pipeline = tfidf_logistic_regression(texts, labels.encode(train.labels, train.row_numbers).numpy(),
                                         problem_type=labels.problem_type, seed=seed)
    results = {"model": "tfidf+logistic_regression", "train_rows": len(train)}
    for split in ("dev", "test"):
        path = getattr(settings, split)
        if not path:
            continue
        rows = read_rows(path, **columns)
        targets = labels.encode(rows.labels, rows.row_numbers).numpy()
        scores = np.asarray(predict_probabilities(pipeline, [join_pair(row) for row in rows.texts]))
        if labels.problem_type == "regression":
            results[split] = regression_metrics(targets, scores)
        elif labels.problem_type == "multi_label_classification":
            results[split] = multilabel_metrics(targets, scores)
        else:
            results[split] = classification_metrics(targets, scores)
    return results
