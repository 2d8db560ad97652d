"""The one fusion rule of hybrid retrieval (tasks/retrieval/hybrid.py)."""
import numpy as np
import pytest

from bertforge.tasks.retrieval.hybrid import WEIGHTS, best_weight, fuse, hybrid_scorer, min_max, remembered


def test_min_max_scales_each_row_to_unit_range_and_flat_rows_to_zero():
    scores = np.array([[1.0, 3.0, 2.0], [5.0, 5.0, 5.0]])
    np.testing.assert_allclose(min_max(scores), [[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]])


def test_fuse_is_the_weighted_sum_of_normalised_scores():
    dense = np.array([[0.9, 0.5, 0.1]])  # the encoder likes document 0
    lexical = np.array([[0.0, 2.0, 10.0]])  # BM25 likes document 2
    np.testing.assert_allclose(fuse(dense, lexical, 1.0), [[1.0, 0.5, 0.0]], atol=1e-6)
    np.testing.assert_allclose(fuse(dense, lexical, 0.0), [[0.0, 0.2, 1.0]], atol=1e-6)
    np.testing.assert_allclose(fuse(dense, lexical, 0.7), [[0.7, 0.35 + 0.06, 0.3]], rtol=1e-6)


def test_fusion_can_rank_first_a_document_neither_ranks_first():
    dense = np.array([[1.0, 0.8, 0.0]])
    lexical = np.array([[0.0, 8.0, 10.0]])
    assert fuse(dense, lexical, 0.5).argmax() == 1


@pytest.mark.parametrize("weight, message", [(-0.1, "must be at least 0, got -0.1"),
                                             (1.5, "must be at most 1, got 1.5")])
def test_a_weight_outside_zero_one_is_refused(weight, message):
    with pytest.raises(ValueError, match=f"dense_weight {message}"):
        fuse(np.zeros((1, 2)), np.zeros((1, 2)), weight)


def test_the_best_weight_is_the_highest_score_and_ties_go_to_the_larger_weight():
    assert best_weight({0.0: 0.2, 0.3: 0.5, 0.7: 0.4, 1.0: 0.1}) == 0.3
    assert best_weight({0.0: 0.2, 0.3: 0.5, 0.6: 0.5, 1.0: 0.1}) == 0.6
    assert best_weight({weight: 0.25 for weight in WEIGHTS}) == 1.0  # all equal: the encoder alone


def test_hybrid_scorer_fuses_two_scorers_and_remembered_scores_once():
    calls = []

    def dense(queries, documents):
        calls.append(len(documents))
        return np.array([[float(len(d)) for d in documents] for _ in queries])

    def lexical(queries, documents):
        return np.array([[float(q in d) for d in documents] for q in queries])

    cached = remembered(dense)
    scorer = hybrid_scorer(cached, lexical, 0.5)
    documents = ["a cat", "the long dog", "cat"]
    first = scorer(["cat"], documents)
    again = hybrid_scorer(cached, lexical, 0.2)(["cat"], list(documents))  # equal lists, a new object
    np.testing.assert_allclose(first, fuse(dense(["cat"], documents), lexical(["cat"], documents), 0.5))
    assert again.shape == (1, 3)
    assert calls == [3, 3]  # the two scorer calls plus the check's own: the cached one ran once
