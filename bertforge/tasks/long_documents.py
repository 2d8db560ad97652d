"""One score per document from the scores of its windows (chunks): mean, max, or ClinicalBERT's mix.

A document longer than one sequence is scored window by window (`tasks.classification.windows.
encode_windows`); these functions turn window probabilities back into document probabilities.
ClinicalBERT (Huang et al. 2019, `vote_score` in kexinhuang12345/clinicalBERT) found that the
max alone is noisy on long notes and the mean alone dilutes one decisive chunk, and mixed them:

    P = (P_max + P_mean * n / c) / (1 + n / c),   n = number of chunks, c = 2 in the paper,

so a short document leans on its strongest chunk and a long one on the average. The paper applies
it to P(readmitted), the positive class; `document_probabilities` says what every kind of task
combines, and is what fine-tuning's evaluation, `predict` and readmission all call.
"""
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from ..validation import checked

Combine = Literal["mean", "max", "clinical"]
METHODS = get_args(Combine)
CLINICALBERT_C = 2.0  # the paper's c: every default of the clinical mix (tasks, readmission) is this one
SINGLE_LABEL = "single_label_classification"


def combine(probabilities: Sequence[float] | np.ndarray, method: str = "mean", c: float = CLINICALBERT_C) -> float:
    """One document's probability from its chunks' probabilities (n,) for one class.

    Raises ValueError for no chunks, an unknown method, or c <= 0.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim != 1 or probabilities.size == 0:
        raise ValueError(f"need a 1-D list of chunk probabilities, got shape {probabilities.shape}")
    # One document of n chunks: the per-document code is the single home of the formulas.
    _, scores = combine_per_document(np.zeros(probabilities.size, dtype=np.int64), probabilities, method, c)
    return float(scores[0])


def document_probabilities(document_index: Sequence[int] | np.ndarray, probabilities: Sequence | np.ndarray,
                           problem_type: str, method: str = "mean",
                           c: float = CLINICALBERT_C) -> tuple[np.ndarray, np.ndarray]:
    """(documents (d,) sorted, scores) from window scores, by the kind of task (Hugging Face's problem_type).

    - single-label, two classes: probabilities (n, 2) softmax rows, or (n,) P(class 1). P(class 1) is
      combined and P(class 0) = 1 - P(class 1), as ClinicalBERT combines P(readmitted): (d, 2), or (d,).
      (Both columns combined and renormalised give another number: windows 0.9, 0.2, 0.1 give 0.45, not
      the paper's 0.6; and "max" of both columns is no distribution.)
    - single-label, more classes (n, k): each column combined on its own, as if it were the positive class;
      "clinical" rows are then divided by their sum, so they are class probabilities again (the winner is
      unchanged); "mean" rows sum to 1 by themselves; "max" rows are each class's highest window
      probability and are left so (their argmax is the class of the most confident window). There is no
      positive class to single out, and the paper has no multi-class rule to follow.
    - multi-label (n, k) sigmoids, and regression (n,) or (n, k) values: each column combined on its own,
      nothing renormalised (labels are independent; values are not probabilities).
    Raises ValueError for mismatched lengths, an unknown method, or c <= 0.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    single_label = problem_type == SINGLE_LABEL and probabilities.ndim == 2
    if single_label and probabilities.shape[1] == 2:
        documents, positive = combine_per_document(document_index, probabilities[:, 1], method, c)
        return documents, np.stack([1 - positive, positive], axis=1)
    documents, scores = combine_per_document(document_index, probabilities, method, c)
    if single_label and method == "clinical":
        scores = scores / scores.sum(axis=1, keepdims=True)
    return documents, scores


def combine_per_document(document_index: Sequence[int] | np.ndarray, probabilities: Sequence | np.ndarray,
                         method: str = "mean", c: float = CLINICALBERT_C) -> tuple[np.ndarray, np.ndarray]:
    """(documents (d,) sorted, scores (d,) or (d, columns)) from window scores, each column on its own.

    document_index (n_windows,) names each window's document; probabilities is (n_windows,) or
    (n_windows, columns). Nothing is renormalised: `document_probabilities` decides that per task.
    Raises ValueError for mismatched lengths, an unknown method, or c <= 0.
    """
    _check(method, c)
    document_index = np.asarray(document_index)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim not in (1, 2) or document_index.shape != probabilities.shape[:1]:
        raise ValueError(f"document_index {document_index.shape} and probabilities {probabilities.shape} "
                         "need one entry per window: shapes (n,) and (n,) or (n, num_classes)")
    if document_index.size == 0:
        raise ValueError("no windows to combine")
    documents, inverse = np.unique(document_index, return_inverse=True)
    scores = probabilities.reshape(len(probabilities), -1)  # (n_windows, columns)
    counts = np.bincount(inverse, minlength=len(documents)).astype(np.float64)[:, None]  # (d, 1)
    sums = np.zeros((len(documents), scores.shape[1]))
    np.add.at(sums, inverse, scores)
    means = sums / counts
    maxima = np.full((len(documents), scores.shape[1]), -np.inf)
    np.maximum.at(maxima, inverse, scores)
    if method == "mean":
        combined = means
    elif method == "max":
        combined = maxima
    else:
        weight = counts / c
        combined = (maxima + means * weight) / (1 + weight)
    return documents, combined if probabilities.ndim == 2 else combined[:, 0]


def _check(method: str, c: float) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {METHODS}")
    checked("c", c, float)
