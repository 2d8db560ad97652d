"""Metrics against small cases worked out by hand (counts in the comments), not against sklearn re-called."""
import math

import numpy as np
import pytest

from bertforge.tasks.metrics import (classification_metrics, multilabel_metrics, ner_metrics, ner_report,
                               readmission_metrics, recall_at_precision, regression_metrics)

# The classic four-point case: sorted by score the labels read 1 (0.8), 0 (0.4), 1 (0.35), 0 (0.1).
LABELS, SCORES = [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]


def test_binary_classification_by_hand():
    results = classification_metrics(LABELS, np.array([[1 - s, s] for s in SCORES]), label_names=["neg", "pos"])
    # Predictions 0 0 0 1: TN 2, FP 0, FN 1, TP 1.
    assert results["accuracy"] == pytest.approx(0.75)
    # F1(neg): P 2/3, R 1 → 0.8; F1(pos): P 1, R 1/2 → 2/3.
    assert results["f1_neg"] == pytest.approx(0.8) and results["f1_pos"] == pytest.approx(2 / 3)
    assert results["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert results["mcc"] == pytest.approx((1 * 2 - 0 * 1) / math.sqrt(1 * 2 * 2 * 3))
    assert results["auroc"] == pytest.approx(3 / 4)  # 3 of 4 (positive, negative) pairs ordered right
    assert results["auprc"] == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)  # precision 1 at rank 1, 2/3 at rank 3
    # A 1-D array is P(class 1): same numbers.
    assert classification_metrics(LABELS, SCORES)["auroc"] == pytest.approx(3 / 4)


def test_multiclass_classification_by_hand():
    labels = [0, 1, 2, 2]
    probabilities = np.array([[.7, .2, .1], [.2, .5, .3], [.1, .3, .6], [.4, .35, .25]])  # predicts 0 1 2 0
    results = classification_metrics(labels, probabilities)
    assert results["accuracy"] == pytest.approx(0.75)
    assert results["macro_f1"] == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)
    # Multi-class MCC: (correct * n - sum(pred_k * true_k)) / sqrt((n² - sum pred_k²)(n² - sum true_k²))
    # with predicted counts 2 1 1 and true counts 1 1 2: (3*4 - 5) / sqrt(10 * 10).
    assert results["mcc"] == pytest.approx(0.7)
    # One-vs-rest AUROC: class 0 → 1, class 1 → 1, class 2: 0.6 beats 0.1 and 0.3, 0.25 beats 0.1 only → 3/4.
    assert results["macro_auroc"] == pytest.approx((1 + 1 + 0.75) / 3)
    assert "auroc" not in results and "auprc" not in results


def test_auroc_is_left_out_when_a_class_is_absent():
    absent = classification_metrics([0, 1, 1], np.array([[.6, .3, .1], [.2, .7, .1], [.3, .3, .4]]))
    assert "macro_auroc" not in absent and absent["accuracy"] == pytest.approx(2 / 3)
    assert "auroc" not in classification_metrics([1, 1], [0.9, 0.2])


def test_multilabel_by_hand():
    labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]])
    probabilities = np.array([[.9, .2, .6], [.1, .7, .4], [.8, .4, .1], [.3, .1, .65]])
    results = multilabel_metrics(labels, probabilities)
    # Predicted [1,0,1] [0,1,0] [1,0,0] [0,0,1]: rows 0 and 1 exact; TP 4, FP 1 (row 3), FN 1 (row 2).
    assert results["subset_accuracy"] == pytest.approx(0.5)
    assert results["micro_f1"] == pytest.approx(2 * 4 / (2 * 4 + 1 + 1))
    assert results["macro_f1"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    # AUROC per label: 1, 1, and label 2's positive 0.6 beats 0.4 and 0.1 but not 0.65 → 2/3.
    assert results["macro_auroc"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    # A label with no positive example has no AUROC: it is left out of the average, not counted as 0.5.
    with_empty = multilabel_metrics(np.hstack([labels, np.zeros((4, 1))]),
                                    np.hstack([probabilities, np.full((4, 1), .2)]))
    assert with_empty["macro_auroc"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    assert multilabel_metrics(labels, probabilities, threshold=0.95)["micro_f1"] == 0.0


def test_regression_by_hand():
    results = regression_metrics([1, 2, 3, 4], [1, 3, 2, 5])
    assert results["mse"] == pytest.approx(3 / 4) and results["mae"] == pytest.approx(3 / 4)
    # Deviations (-1.5, -.5, .5, 1.5) and (-1.75, .25, -.75, 2.25): 5.5 / sqrt(5 * 8.75).
    assert results["pearson"] == pytest.approx(5.5 / math.sqrt(5 * 8.75))
    assert results["spearman"] == pytest.approx(1 - 6 * 2 / (4 * (16 - 1)))  # two ranks swapped
    assert math.isnan(regression_metrics([1, 2, 3], [2, 2, 2])["pearson"])
    with pytest.raises(ValueError, match="two or more"):
        regression_metrics([1, 2], [1])


TRUE_TAGS = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"], ["B-LOC", "I-LOC"]]
PREDICTED_TAGS = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "O"], ["B-LOC", "O"]]


def test_ner_scores_whole_entities():
    results = ner_metrics(TRUE_TAGS, PREDICTED_TAGS)
    # True entities: PER, LOC, ORG, LOC(2 words); predicted: PER, ORG, LOC(1 word): only PER and ORG match.
    assert results["precision"] == pytest.approx(2 / 3)
    assert results["recall"] == pytest.approx(2 / 4)
    assert results["f1"] == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))
    assert results["token_accuracy"] == pytest.approx(6 / 8)
    # conlleval's default mode: an I- tag after O starts an entity, so I-PER and B-PER agree.
    assert ner_metrics([["I-PER", "O"]], [["B-PER", "O"]])["f1"] == pytest.approx(1.0)


def test_ner_report_per_type():
    report = ner_report(TRUE_TAGS, PREDICTED_TAGS)
    assert report["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1.0}
    assert report["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2.0}
    assert report["micro avg"]["recall"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="sentence 1: 2 true tags but 1 predicted"):
        ner_report(TRUE_TAGS, [PREDICTED_TAGS[0], ["O"], PREDICTED_TAGS[2]])


def test_rp80_as_clinicalbert_computes_it():
    # Thresholds 0.1 0.35 0.4 0.8 give precision .5 .67 .5 1 and recall 1 1 .5 .5: the first row above
    # 0.8 is threshold 0.8, recall 0.5.
    assert recall_at_precision(LABELS, SCORES) == pytest.approx(0.5)
    # Sorted by score the labels read 1 0 1 1 1: at the lowest threshold precision is exactly 4/5, which
    # ClinicalBERT's `prec > 0.799999` counts, so RP80 is a full recall of 1.
    labels, scores = [1, 0, 1, 1, 1], [.9, .8, .7, .6, .5]
    assert recall_at_precision(labels, scores, 0.8) == pytest.approx(1.0)
    # Above 81% only the top threshold (precision 1, recall 1/4) qualifies.
    assert recall_at_precision(labels, scores, 0.81) == pytest.approx(0.25)
    # The best-scored document is a negative: no real threshold reaches 80%, so 0 (the curve's end
    # point, precision 1 at recall 0, has no threshold and is not counted).
    assert recall_at_precision([1, 0], [0.1, 0.9]) == 0.0


def test_readmission_metrics_by_hand():
    results = readmission_metrics(LABELS, SCORES)
    assert results["auroc"] == pytest.approx(0.75)
    assert results["auprc"] == pytest.approx(5 / 6)
    assert results["rp80"] == pytest.approx(0.5)
    # Trapezoids under recall 1 → .5 (precision .67 → .5) and .5 → 0 (precision 1): .2917 + .5.
    assert results["auprc_trapezoid"] == pytest.approx(0.5 * (2 / 3 + 0.5) / 2 + 0.5)
    with pytest.raises(ValueError, match="both 0 and 1"):
        readmission_metrics([1, 1], [0.2, 0.3])


def test_shape_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"\(n,\) and \(n, num_classes\)"):
        classification_metrics([0, 1, 0], np.ones((2, 2)) / 2)
    with pytest.raises(ValueError, match="0..1"):
        classification_metrics([0, 2], np.ones((2, 2)) / 2)
