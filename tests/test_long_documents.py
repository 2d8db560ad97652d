"""Combining window scores per document: ClinicalBERT's formula by hand, its limits, the vectorised path, and what
each kind of task combines."""
import numpy as np
import pytest

from bertforge.tasks.long_documents import SINGLE_LABEL, combine, combine_per_document, document_probabilities


def test_clinical_formula_worked_by_hand():
    # Pmax 0.9, Pmean 0.4, n/c = 3/2 = 1.5: (0.9 + 0.4 * 1.5) / (1 + 1.5) = 1.5 / 2.5 = 0.6
    assert combine([0.9, 0.2, 0.1], "clinical", c=2.0) == pytest.approx(0.6)
    # c=1: n/c = 3: (0.9 + 1.2) / 4 = 0.525
    assert combine([0.9, 0.2, 0.1], "clinical", c=1.0) == pytest.approx(0.525)
    assert combine([0.9, 0.2, 0.1], "mean") == pytest.approx(0.4)
    assert combine([0.9, 0.2, 0.1], "max") == pytest.approx(0.9)


def test_clinical_is_the_chunk_itself_for_one_chunk_and_tends_to_the_mean_for_many():
    assert combine([0.37], "clinical") == pytest.approx(0.37)
    # One decisive chunk among many quiet ones: the max matters less as n grows.
    few = combine([0.9] + [0.1] * 3, "clinical")
    many = [0.9] + [0.1] * 9999
    assert few > combine(many, "clinical")
    assert combine(many, "clinical") == pytest.approx(np.mean(many), abs=2e-4)
    assert combine(many, "clinical") > np.mean(many)


def test_per_document_matches_the_scalar_version_and_sorts_documents():
    document_index = [2, 0, 2, 2, 0, 5]
    probabilities = [0.9, 0.3, 0.2, 0.1, 0.5, 0.7]
    for method in ("mean", "max", "clinical"):
        documents, scores = combine_per_document(document_index, probabilities, method)
        assert documents.tolist() == [0, 2, 5]
        expected = [combine([0.3, 0.5], method), combine([0.9, 0.2, 0.1], method), combine([0.7], method)]
        np.testing.assert_allclose(scores, expected)
    assert combine_per_document(document_index, probabilities, "clinical")[1][1] == pytest.approx(0.6)


def test_a_two_class_document_combines_p_class_1_as_clinicalbert():
    """Both softmax columns were combined and the rows renormalised: windows P(1) 0.9, 0.2, 0.1 gave 0.4545,
    not the paper's 0.6, and "max" gave [0.9, 0.9] with label 0 although a window said 0.9 for class 1."""
    document_index = [0, 0, 0, 1]
    positive = np.array([0.9, 0.2, 0.1, 0.4])
    softmax = np.stack([1 - positive, positive], axis=1)
    expected = {"clinical": [0.6, 0.4], "mean": [0.4, 0.4], "max": [0.9, 0.4]}
    for method, p_one in expected.items():
        documents, scores = document_probabilities(document_index, softmax, SINGLE_LABEL, method)
        assert documents.tolist() == [0, 1]
        np.testing.assert_allclose(scores, np.stack([1 - np.array(p_one), p_one], axis=1))
        # P(class 1) alone, as readmission passes it, is the same number.
        np.testing.assert_allclose(document_probabilities(document_index, positive, SINGLE_LABEL, method)[1], p_one)
    assert document_probabilities(document_index, softmax, SINGLE_LABEL, "max")[1].argmax(axis=1).tolist() == [1, 0]


def test_more_classes_are_combined_column_by_column_and_clinical_rows_renormalised():
    document_index = [0, 0, 0, 1]
    probabilities = np.array([[0.9, 0.05, 0.05], [0.2, 0.6, 0.2], [0.1, 0.7, 0.2], [0.6, 0.3, 0.1]])
    _, mean = document_probabilities(document_index, probabilities, SINGLE_LABEL, "mean")
    np.testing.assert_allclose(mean, [[0.4, 0.45, 0.15], [0.6, 0.3, 0.1]])
    _, maxima = document_probabilities(document_index, probabilities, SINGLE_LABEL, "max")
    np.testing.assert_allclose(maxima, [[0.9, 0.7, 0.2], [0.6, 0.3, 0.1]])  # each class's best window, as it is
    _, clinical = document_probabilities(document_index, probabilities, SINGLE_LABEL, "clinical")
    # Column 0: 0.6 (the worked example); 1: (0.7 + 0.45 * 1.5) / 2.5 = 0.55; 2: (0.2 + 0.15 * 1.5) / 2.5 = 0.17.
    np.testing.assert_allclose(clinical[0], np.array([0.6, 0.55, 0.17]) / 1.32)
    np.testing.assert_allclose(clinical[1], [0.6, 0.3, 0.1])  # one window: itself


def test_multi_label_and_regression_columns_are_combined_independently():
    document_index = [0, 0, 0, 1]
    sigmoids = np.array([[0.9, 0.9], [0.2, 0.8], [0.1, 0.7], [0.6, 0.1]])
    _, clinical = document_probabilities(document_index, sigmoids, "multi_label_classification", "clinical")
    # Column 1: Pmax 0.9, Pmean 0.8 -> (0.9 + 0.8 * 1.5) / 2.5 = 0.84; rows are not renormalised.
    np.testing.assert_allclose(clinical, [[0.6, 0.84], [0.6, 0.1]])
    _, values = document_probabilities(document_index, [3.0, -1.0, 1.0, 2.5], "regression", "mean")
    np.testing.assert_allclose(values, [1.0, 2.5])


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="unknown method 'median'.*'mean', 'max', 'clinical'"):
        combine([0.5], "median")
    with pytest.raises(ValueError, match="c must be greater than 0, got 0"):
        combine([0.5], "clinical", c=0)
    with pytest.raises(ValueError, match="chunk probabilities"):
        combine([], "mean")
    with pytest.raises(ValueError, match="one entry per window"):
        combine_per_document([0, 1], [0.5], "mean")
