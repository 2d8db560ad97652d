"""One score per document from the scores of its windows (chunks): mean, max, or ClinicalBERT's mix.

A document longer than one sequence is scored window by window (`tasks.classification.windows.
encode_windows`); these functions turn window probabilities back into document probabilities.
ClinicalBERT (Huang et al. 2019, `vote_score` in kexinhuang12345/clinicalBERT) found that the
max alone is noisy on long notes and the mean alone dilutes one decisive chunk, and mixed them:

    P = (P_max + P_mean * n / c) / (1 + n / c),   n = number of chunks, c = 2 in the paper,

so a short document leans on its strongest chunk and a long one on the average.
"""
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from ..validation import checked

Combine = Literal["mean", "max", "clinical"]
METHODS = get_args(Combine)
CLINICALBERT_C = 2.0  # the paper's c: every default of the clinical mix (tasks, readmission) is this one


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


def combine_per_document(document_index: Sequence[int] | np.ndarray, probabilities: Sequence | np.ndarray,
                         method: str = "mean", c: float = CLINICALBERT_C) -> tuple[np.ndarray, np.ndarray]:
    """(documents (d,) sorted, scores (d,) or (d, num_classes)) from window probabilities.

    document_index (n_windows,) names each window's document; probabilities is (n_windows,) (one
    class, e.g. P(readmitted)) or (n_windows, num_classes). Columns are combined one by one. With
    "clinical" on 2-D input each row is then divided by its sum, because the formula applied per
    class does not keep rows summing to 1 and callers take these as class probabilities; "mean"
    keeps the sum of 1 by itself and "max" scores are left as they are (argmax is unchanged by
    scaling). To reproduce ClinicalBERT's binary score exactly, pass the positive-class column
    only: renormalised two-column output is a different number.
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
    scores = probabilities.reshape(len(probabilities), -1)  # (n_windows, classes)
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
        if probabilities.ndim == 2:
            combined = combined / combined.sum(axis=1, keepdims=True)
    return documents, combined if probabilities.ndim == 2 else combined[:, 0]


def _check(method: str, c: float) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {METHODS}")
    checked("c", c, float)
