"""The one fusion rule of hybrid retrieval (tasks/retrieval/hybrid.py)."""
import numpy as np
import pytest

from bertforge.tasks.retrieval.evaluation import evaluate_retrieval
from bertforge.tasks.retrieval.hybrid import WEIGHTS, best_weight, fuse, hybrid_scorer, min_max, remembered
from bertforge.tasks.retrieval.reader import RetrievalSet


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


def test_min_max_leaves_a_minus_infinity_column_out_of_the_range():
    scores = np.array([[1.0, -np.inf, 3.0, 2.0], [-np.inf, -np.inf, -np.inf, -np.inf]])
    np.testing.assert_allclose(min_max(scores), [[0.0, -np.inf, 1.0, 0.5], [-np.inf] * 4])


# One query, q1, that is also corpus document q1 (a review-to-review set): its own cosine 1.0 and the top BM25 score.
OWN_IDS = ["q1", "d2", "d3", "d4"]
OWN_DENSE = np.array([[1.0, 0.6, 0.5, 0.1]])
OWN_LEXICAL = np.array([[20.0, 1.0, 3.0, 0.0]])


def test_a_querys_own_document_is_left_out_before_fusing_not_after():
    """As the maxima of both sides the own document squashed BM25's side (d3's 3 became 0.15, not 1): fused over
    every document d2 beat d3; over the documents actually ranked (BEIR leaves q1 out) d3 wins, 0.9 to 0.667."""
    retrieval_set = RetrievalSet(["q1"], ["a review"], OWN_IDS, ["q1's review", "b", "c", "d"], {"q1": ["d2"]})
    scorer = hybrid_scorer(lambda queries, documents: OWN_DENSE, lambda queries, documents: OWN_LEXICAL, 0.5)
    # d2, the relevant one, second behind d3 (by hand): 1 / log2(3). Fused with q1 in the range it was first: 1.0
    assert evaluate_retrieval(scorer, retrieval_set)["ndcg@10"] == pytest.approx(1 / np.log2(3))
    fused = fuse(OWN_DENSE, OWN_LEXICAL, 0.5, exclude=[0])
    assert fused[0, 0] == -np.inf
    np.testing.assert_allclose(fused[:, 1:], fuse(OWN_DENSE[:, 1:], OWN_LEXICAL[:, 1:], 0.5), rtol=1e-6)
    np.testing.assert_allclose(fused[0, 1:], [0.5 + 0.5 / 3, 0.4 + 0.5, 0.0], rtol=1e-6)


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_leaving_out_changes_no_other_column_when_nothing_is_left_out_and_no_input(weight):
    dense, lexical = OWN_DENSE.copy(), OWN_LEXICAL.copy()
    np.testing.assert_array_equal(fuse(dense, lexical, weight, exclude=[None]), fuse(dense, lexical, weight))
    fused = fuse(dense, lexical, weight, exclude=[0])
    assert fused[0, 0] == -np.inf and np.isfinite(fused[0, 1:]).all()  # no 0 * -inf left at weight 0 or 1
    np.testing.assert_array_equal(dense, OWN_DENSE)  # a remembered scorer's matrix is used again at the next weight
    np.testing.assert_array_equal(lexical, OWN_LEXICAL)
