"""The TF-IDF + linear baseline on real tweets: beats the majority class, is reproducible, covers every problem type."""
import logging

import numpy as np
import pytest

from bertforge.tasks.classification.tfidf import C_GRID, join_pair, predict_probabilities, tfidf_logistic_regression
from bertforge.tasks.classification.labels import LabelSpace
from bertforge.tasks.classification.reader import read_rows
from bertforge.tasks.metrics import classification_metrics


@pytest.fixture(scope="module")
def tweets(data_dir):
    """A fixed 3,000 / 1,000 split of the sentiment tweets: (train texts, train ids, test texts, test ids)."""
    rows = read_rows(data_dir / "tweets-sentiment" / "tweets.csv", text_columns=["text"], label_column="sentiment")
    order = np.random.default_rng(0).permutation(len(rows))[:4000]
    texts = [rows.texts[i][0] for i in order]
    ids = LabelSpace.infer(rows.labels).encode([rows.labels[i] for i in order]).numpy()
    return texts[:3000], ids[:3000], texts[3000:], ids[3000:]


def test_cross_validated_baseline_clearly_beats_the_majority_class(tweets, caplog):
    train_texts, train_ids, test_texts, test_ids = tweets
    with caplog.at_level(logging.WARNING):
        pipeline = tfidf_logistic_regression(train_texts, train_ids, test_texts)
    assert float(np.ravel(pipeline.named_steps["model"].C_)[0]) in C_GRID
    probabilities = predict_probabilities(pipeline, test_texts)
    assert probabilities.shape == (1000, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    majority = np.bincount(test_ids).max() / len(test_ids)  # 0.42: negative
    results = classification_metrics(test_ids, probabilities)
    assert results["accuracy"] > majority + 0.15, results
    assert results["macro_f1"] > 0.55, results
    # Retweets repeat across the split; the baseline says so instead of quietly scoring them.
    assert "test texts also appear verbatim in the training texts" in caplog.text


def test_same_seed_same_predictions(tweets):
    train_texts, train_ids, test_texts, _ = tweets
    # saga draws samples at random: only the seed makes two fits agree.
    first = predict_probabilities(tfidf_logistic_regression(train_texts, train_ids, C=4.0, seed=3), test_texts)
    again = predict_probabilities(tfidf_logistic_regression(train_texts, train_ids, C=4.0, seed=3), test_texts)
    np.testing.assert_array_equal(first, again)


def test_binary_multi_label_and_regression(tweets):
    train_texts, train_ids, test_texts, test_ids = tweets
    # Two classes take another path through scikit-learn's cross-validation (pos_label).
    polar = np.flatnonzero(train_ids[:1000] != 1)
    binary = tfidf_logistic_regression([train_texts[i] for i in polar], train_ids[polar] // 2)
    assert predict_probabilities(binary, ["I love it, great flight", "worst delay ever, awful"]).argmax(1).tolist() \
        == [1, 0]
    # Two overlapping-free labels with "neither" allowed (neutral): the multi-hot layout of a multi-label task.
    multi_hot = np.stack([train_ids == 0, train_ids == 2], axis=1).astype(int)[:1000]
    # C fixed: the cross-validation path is the binary one above, once per label.
    pipeline = tfidf_logistic_regression(train_texts[:1000], multi_hot, problem_type="multi_label_classification",
                                         C=4.0)
    probabilities = predict_probabilities(pipeline, test_texts[:300])
    assert probabilities.shape == (300, 2) and ((probabilities >= 0) & (probabilities <= 1)).all()
    truth = np.stack([test_ids[:300] == 0, test_ids[:300] == 2], axis=1)
    assert ((probabilities >= 0.5) == truth).mean() > 0.7
    # Regression on the class id as a number (negative 0 < neutral 1 < positive 2): predictions track it.
    regression = tfidf_logistic_regression(train_texts[:600], train_ids[:600].astype(float),
                                           problem_type="regression")
    assert regression.named_steps["model"].alpha_ in [1 / c for c in C_GRID]
    predictions = predict_probabilities(regression, test_texts[:300])
    assert predictions.shape == (300,)
    assert np.corrcoef(predictions, test_ids[:300])[0, 1] > 0.3


def test_pairs_are_joined_and_bad_input_is_named():
    assert join_pair(("Is it late?", "It is.")) == "Is it late? [SEP] It is."
    assert join_pair(("alone",)) == "alone"
    with pytest.raises(ValueError, match=r"train_texts\[0\] is a tuple.*join_pair"):
        tfidf_logistic_regression([("a", "b")], [0])
    with pytest.raises(ValueError, match="2 training texts but 1 labels"):
        tfidf_logistic_regression(["a", "b"], [0])
    with pytest.raises(ValueError, match="unknown problem_type 'ranking'"):
        tfidf_logistic_regression(["a"], [0], problem_type="ranking")
