"""Combining window scores per document: ClinicalBERT's formula by hand, its limits, the vectorised path."""
import numpy as np
import pytest

from bertforge.tasks.long_documents import combine, combine_per_document


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


def test_multiclass_columns_are_combined_and_clinical_rows_renormalised():
    document_index = [0, 0, 0, 1]
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.6, 0.4]])
    _, mean = combine_per_document(document_index, probabilities, "mean")
    np.testing.assert_allclose(mean, [[0.4, 0.6], [0.6, 0.4]])
    _, maxima = combine_per_document(document_index, probabilities, "max")
    np.testing.assert_allclose(maxima, [[0.9, 0.9], [0.6, 0.4]])  # max is not renormalised
    _, clinical = combine_per_document(document_index, probabilities, "clinical")
    # Column 0: 0.6 (the worked example); column 1: (0.9 + 0.6 * 1.5) / 2.5 = 0.72; sum 1.32.
    np.testing.assert_allclose(clinical[0], [0.6 / 1.32, 0.72 / 1.32])
    np.testing.assert_allclose(clinical.sum(axis=1), 1.0)
    np.testing.assert_allclose(clinical[1], [0.6, 0.4])  # one window: itself


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="unknown method 'median'.*'mean', 'max', 'clinical'"):
        combine([0.5], "median")
    with pytest.raises(ValueError, match="c must be greater than 0, got 0"):
        combine([0.5], "clinical", c=0)
    with pytest.raises(ValueError, match="chunk probabilities"):
        combine([], "mean")
    with pytest.raises(ValueError, match="one entry per window"):
        combine_per_document([0, 1], [0.5], "mean")
