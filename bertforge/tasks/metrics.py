"""Evaluation metrics as plain dicts of floats, computed by scikit-learn, scipy and seqeval.

One function per kind of task: classification (binary or multi-class), multi-label, regression,
NER (entity level, as the CoNLL script scores it; BILOU strictly), and the readmission metrics of ClinicalBERT
(AUROC, AUPRC, recall at 80% precision). A metric that is undefined for the data (AUROC when a
class is absent) is left out of the dict rather than reported as a misleading number.
"""
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats
from sklearn import metrics as sk


def classification_metrics(labels: Sequence[int] | np.ndarray, probabilities: np.ndarray,
                           label_names: Sequence[str] | None = None) -> dict[str, float]:
    """accuracy, macro_f1, mcc; binary adds auroc and auprc; multi-class adds macro_auroc (one-vs-rest).

    labels (n,) class ids; probabilities (n, num_classes), or (n,) P(class 1) for binary.
    label_names adds f1_<name> per class. AUROC needs both classes (binary) or every class
    (multi-class) among the labels and is left out otherwise. Raises ValueError for mismatched shapes.
    """
    labels = np.asarray(labels).astype(np.int64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if probabilities.ndim == 1:
        probabilities = np.stack([1 - probabilities, probabilities], axis=1)
    _check_rows(labels, probabilities)
    num_classes = probabilities.shape[1]
    predictions = probabilities.argmax(axis=1)
    results = {"accuracy": sk.accuracy_score(labels, predictions),
               "macro_f1": sk.f1_score(labels, predictions, average="macro", zero_division=0),
               "mcc": sk.matthews_corrcoef(labels, predictions)}
    present = np.unique(labels)
    if num_classes == 2:
        if len(present) == 2:
            results["auroc"] = sk.roc_auc_score(labels, probabilities[:, 1])
            results["auprc"] = sk.average_precision_score(labels, probabilities[:, 1])
    elif len(present) == num_classes:
        # roc_auc_score's multi-class check wants rows summing to 1 exactly, not to float error.
        normalised = probabilities / probabilities.sum(axis=1, keepdims=True)
        results["macro_auroc"] = sk.roc_auc_score(labels, normalised, multi_class="ovr", average="macro",
                                                  labels=np.arange(num_classes))
    if label_names is not None:
        per_class = sk.f1_score(labels, predictions, labels=np.arange(num_classes), average=None, zero_division=0)
        results.update({f"f1_{name}": score for name, score in zip(label_names, per_class)})
    return _floats(results)


def multilabel_metrics(labels_multi_hot: np.ndarray, probabilities: np.ndarray,
                       threshold: float = 0.5) -> dict[str, float]:
    """micro_f1, macro_f1, subset_accuracy (every label right) and macro_auroc over labels that have
    both a positive and a negative example (left out when none has).

    labels_multi_hot and probabilities are (n, num_labels); a label is predicted when its
    probability is >= threshold. Raises ValueError for mismatched shapes.
    """
    labels = np.asarray(labels_multi_hot).astype(np.int64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if labels.ndim != 2 or labels.shape != probabilities.shape:
        raise ValueError(f"labels {labels.shape} and probabilities {probabilities.shape} must both be "
                         "(n, num_labels)")
    predictions = (probabilities >= threshold).astype(np.int64)
    results = {"micro_f1": sk.f1_score(labels, predictions, average="micro", zero_division=0),
               "macro_f1": sk.f1_score(labels, predictions, average="macro", zero_division=0),
               "subset_accuracy": sk.accuracy_score(labels, predictions)}
    defined = (labels.min(axis=0) == 0) & (labels.max(axis=0) == 1)
    if defined.any():
        results["macro_auroc"] = sk.roc_auc_score(labels[:, defined], probabilities[:, defined], average="macro")
    return _floats(results)


def regression_metrics(targets: Sequence[float] | np.ndarray,
                       predictions: Sequence[float] | np.ndarray) -> dict[str, float]:
    """pearson, spearman, mse, mae. A correlation with a constant input is nan (undefined), not an error.

    Raises ValueError for mismatched lengths or fewer than two values.
    """
    targets = np.asarray(targets, dtype=np.float64).reshape(-1)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(-1)
    if targets.shape != predictions.shape or targets.size < 2:
        raise ValueError(f"need two or more targets and as many predictions, got {targets.size} and "
                         f"{predictions.size}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        pearson = stats.pearsonr(targets, predictions).statistic
        spearman = stats.spearmanr(targets, predictions).statistic
    return _floats({"pearson": pearson, "spearman": spearman,
                    "mse": sk.mean_squared_error(targets, predictions),
                    "mae": sk.mean_absolute_error(targets, predictions)})


def problem_metrics(problem_type: str, targets: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """The metrics of a classification problem: `regression`, `multi_label_classification` or single-label.

    targets and scores as the function for that kind takes them (class ids and probabilities,
    multi-hot rows and probabilities, or values and predictions).
    """
    if problem_type == "regression":
        return regression_metrics(targets, scores)
    if problem_type == "multi_label_classification":
        return multilabel_metrics(targets, scores)
    return classification_metrics(targets, scores)


def ner_metrics(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and f1 (micro average over entities) and token_accuracy.

    Tags are IOB1/IOB2/IOE/IOBES strings (seqeval's default mode, as conlleval scores them) or
    BILOU (strict mode), one list per sentence. Raises ValueError when sentence counts or lengths
    differ, or the tags mix BILOU and IOBES.
    """
    from seqeval import metrics as seq  # imported here: only NER needs seqeval

    scoring = _seqeval_scoring(true_tags, predicted_tags)
    return _floats({"precision": seq.precision_score(true_tags, predicted_tags, zero_division=0, **scoring),
                    "recall": seq.recall_score(true_tags, predicted_tags, zero_division=0, **scoring),
                    "f1": seq.f1_score(true_tags, predicted_tags, zero_division=0, **scoring),
                    "token_accuracy": seq.accuracy_score(true_tags, predicted_tags)})


def ner_report(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict[str, dict[str, float]]:
    """Per entity type (and "micro avg", "macro avg", "weighted avg"): precision, recall, f1, support.

    Scored as `ner_metrics` scores. Raises ValueError when sentence counts or lengths differ.
    """
    from seqeval.metrics import classification_report

    scoring = _seqeval_scoring(true_tags, predicted_tags)
    report = classification_report(true_tags, predicted_tags, output_dict=True, zero_division=0, **scoring)
    return {name: {"precision": float(row["precision"]), "recall": float(row["recall"]),
                   "f1": float(row["f1-score"]), "support": float(row["support"])}
            for name, row in report.items()}


def _seqeval_scoring(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict:
    """seqeval's keyword arguments for these tags' scheme, after checking their shapes."""
    from .ner.schemes import seqeval_scoring

    _check_tag_lengths(true_tags, predicted_tags)
    return seqeval_scoring(tag for tags in (true_tags, predicted_tags) for sentence in tags for tag in sentence)


def recall_at_precision(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray,
                        precision: float = 0.8) -> float:
    """Recall at the lowest threshold whose precision reaches `precision` (RP80 at 0.8), as ClinicalBERT computes it.

    kexinhuang12345/clinicalBERT's `vote_pr_curve` zips sklearn's precision_recall_curve into
    (precision, recall, threshold) rows, which drops the final (precision 1, recall 0) point
    that has no threshold, keeps rows with precision > 0.799999 (so exactly 80% counts), and
    takes the recall of the first row in curve order (lowest threshold, so the highest recall);
    0.0 when no row qualifies. Raises ValueError unless labels hold both 0 and 1.
    """
    labels, scores = binary_labels(labels, scores)
    precisions, recalls, thresholds = sk.precision_recall_curve(labels, scores)
    rows = zip(precisions[:len(thresholds)], recalls[:len(thresholds)])
    return float(next((recall for row_precision, recall in rows if row_precision > precision - 1e-6), 0.0))


def readmission_metrics(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> dict[str, float]:
    """ClinicalBERT's readmission metrics of document scores: auroc, auprc, rp80, auprc_trapezoid.

    auprc is average precision (sklearn's recommended area); auprc_trapezoid is the trapezoidal
    area under the PR curve that ClinicalBERT's code reports (`auc(recall, precision)`, slightly
    optimistic), for comparison with the paper. Raises ValueError unless labels hold both 0 and 1.
    """
    labels, scores = binary_labels(labels, scores)
    precisions, recalls, _ = sk.precision_recall_curve(labels, scores)
    return _floats({"auroc": sk.roc_auc_score(labels, scores),
                    "auprc": sk.average_precision_score(labels, scores),
                    "rp80": recall_at_precision(labels, scores, 0.8),
                    "auprc_trapezoid": sk.auc(recalls, precisions)})


def binary_labels(labels, scores=None, what: str = "labels") -> tuple[np.ndarray, np.ndarray | None]:
    """(labels as int64 0/1, scores as float64), both flat; the one check that both classes are there.

    Raises ValueError naming `what` when the lengths differ or a class is missing (AUROC and
    precision-recall need positives and negatives; so does training a detector).
    """
    labels = np.asarray(labels).reshape(-1)
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float64).reshape(-1)
        if labels.shape != scores.shape:
            raise ValueError(f"{what}: {labels.size} labels but {scores.size} scores; pass one score per document")
    if set(np.unique(labels).tolist()) != {0, 1}:
        raise ValueError(f"{what} must be 0 and 1 with both present, found {sorted(set(np.unique(labels).tolist()))}; "
                         "AUROC, precision-recall and training a detector need both 0 and 1")
    return labels.astype(np.int64), scores


def _check_rows(labels: np.ndarray, probabilities: np.ndarray) -> None:
    if labels.ndim != 1 or probabilities.ndim != 2 or len(labels) != len(probabilities):
        raise ValueError(f"labels {labels.shape} and probabilities {probabilities.shape} must be (n,) and "
                         "(n, num_classes)")
    if len(labels) and (labels.min() < 0 or labels.max() >= probabilities.shape[1]):
        raise ValueError(f"label ids must lie in 0..{probabilities.shape[1] - 1} for {probabilities.shape[1]} "
                         f"classes, found {labels.min()}..{labels.max()}")


def _check_tag_lengths(true_tags: list[list[str]], predicted_tags: list[list[str]]) -> None:
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"{len(true_tags)} true sentences but {len(predicted_tags)} predicted; pass one tag "
                         "list per sentence")
    for index, (true, predicted) in enumerate(zip(true_tags, predicted_tags)):
        if len(true) != len(predicted):
            raise ValueError(f"sentence {index}: {len(true)} true tags but {len(predicted)} predicted; "
                             "predict one tag per word (first piece of each word)")


def _floats(results: dict) -> dict[str, float]:
    return {name: float(value) for name, value in results.items()}
