"""The dense score with each passage's best sentence mixed in (tasks/retrieval/sentences.py): the rule itself.
The index's use of it is tests/test_search_sentences.py; adapt's pick of its weight tests/test_adapt.py."""
import numpy as np
import pytest

from bertforge.tasks.retrieval.sentences import (best_sentence_scores, mixed, passage_sentences, sentence_owners,
                                                 sentence_scorer)


def test_best_sentence_scores_take_the_max_over_each_passages_own_sentences():
    rng = np.random.default_rng(0)
    queries, sentences = rng.normal(size=(3, 8)), rng.normal(size=(7, 8))
    owners = np.array([0, 0, 0, 1, 2, 2, 3])
    best = best_sentence_scores(queries, sentences, owners, passages=4)
    by_hand = np.array([[max(q @ sentences[i] for i in np.flatnonzero(owners == p)) for p in range(4)]
                        for q in queries])
    np.testing.assert_allclose(best, by_hand, rtol=1e-6)


def test_a_passage_without_sentences_is_refused():
    with pytest.raises(ValueError, match="every passage needs one"):
        best_sentence_scores(np.ones((1, 2)), np.ones((2, 2)), np.array([0, 2]), passages=3)


def test_passages_split_as_the_corpus_reader_splits_them_and_never_into_nothing():
    texts = ["Emma was handsome. She was clever and rich.", "no full stop here", "   "]
    sentences, owners = sentence_owners(texts)
    assert sentences == ["Emma was handsome.", "She was clever and rich.", "no full stop here", "   "]
    assert owners.tolist() == [0, 0, 1, 2]
    assert passage_sentences("A heading\n\nA paragraph under it.") == ["A heading", "A paragraph under it."]


def test_the_scorer_mixes_the_passage_and_its_best_sentence():
    first, second, other = "Emma was handsome.", "She was clever and rich.", "Harriet came in."
    passage = f"{first} {second}"
    vectors = {"q": [1.0, 0.0], passage: [0.6, 0.8], first: [1.0, 0.0], second: [0.0, 1.0], other: [0.8, 0.6]}

    def embed(texts):
        return np.array([vectors[t] for t in texts])

    for weight in (0.0, 0.25, 1.0):
        scores = sentence_scorer(embed, weight)(["q"], [passage, other])
        # the passage scores 0.6 by its vector, 1.0 by its best sentence; the other is its own only sentence, 0.8
        np.testing.assert_allclose(scores, [[(1 - weight) * 0.6 + weight * 1.0, 0.8]])
    np.testing.assert_allclose(mixed(np.full((1, 1), 0.6), np.ones((1, 1)), 0.5), [[0.8]])


def test_the_served_pair_is_the_simplest_within_one_standard_error_of_the_best():
    from bertforge.tasks.retrieval.sentences import best_weights, simplest_within_one_se

    best = np.array([1.0, 0.5, 1.0, 0.0, 1.0, 0.5, 1.0, 0.5])
    noisy = best + np.array([-0.5, 0.5, 0.0, 0.5, -0.5, 0.0, -0.5, 0.0])  # mean 0.0625 lower, paired error 0.125
    worse = best - 0.25  # 0.25 lower on every query: the queries tell it apart
    per_query = {(0.75, 0.6): best, (0.25, 0.9): noisy, (0.0, 1.0): worse, (0.5, 0.9): best - 0.01}
    assert best_weights({pair: scores.mean() for pair, scores in per_query.items()}) == (0.75, 0.6)
    assert simplest_within_one_se(per_query) == (0.25, 0.9)
    assert simplest_within_one_se({(0.5, 0.7): best}) == (0.5, 0.7)


def test_ndcg_per_query_averages_to_retrieval_metrics():
    from bertforge.tasks.retrieval.metrics import ndcg_per_query, retrieval_metrics

    rng = np.random.default_rng(1)
    scores, relevant = rng.normal(size=(20, 30)), [[int(q % 30)] if q % 3 else [q % 30, (q + 7) % 30] for q in range(20)]
    per_query = ndcg_per_query(scores, relevant)
    assert per_query.shape == (20,) and np.isclose(per_query.mean(), retrieval_metrics(scores, relevant)["ndcg@10"])
