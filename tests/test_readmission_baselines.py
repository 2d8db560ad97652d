"""Readmission baselines (bag-of-words, Bi-LSTM) on synthetic chunks, admission scores, Table 4 and curves."""
import csv
import re

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from bertforge.readmission.baselines import (BiLSTMClassifier, Vocabulary, admission_scores, bag_of_words,
                                             chunk_probabilities, train_bilstm)
from bertforge.readmission.report import plot_curves, table4, table4_csv

FILLER = [f"word{i}" for i in range(40)]
TINY_BILSTM = {"epochs": 3, "batch_size": 16, "lr": 1e-2, "embedding_dim": 16, "hidden_size": 16, "min_count": 1}


def make_chunks(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Chunks of filler words; a readmitted one usually says "noncompliance" or "chf", a other one "stable"."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    texts = []
    for label in labels:
        words = list(rng.choice(FILLER, rng.integers(12, 24)))
        if rng.random() < 0.9:
            cue = rng.choice(["noncompliance", "chf"]) if label else "stable"
            words.insert(int(rng.integers(0, len(words) + 1)), str(cue))
        texts.append(" ".join(words))
    return texts, labels


@pytest.fixture(scope="module")
def chunks():
    return make_chunks(240, seed=1), make_chunks(200, seed=2)


def test_bag_of_words_learns_the_driving_words(chunks):
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    pipeline = bag_of_words(train_texts, train_labels, seed=0)
    scores = chunk_probabilities(pipeline, test_texts)
    assert scores.shape == (200,)
    assert roc_auc_score(test_labels, scores) > 0.8
    vocabulary = pipeline.named_steps["counts"].vocabulary_
    assert len(vocabulary) == len(FILLER) + 3
    weights = pipeline.named_steps["model"].coef_[0]
    assert weights[vocabulary["chf"]] > 0 > weights[vocabulary["stable"]]
    again = bag_of_words(train_texts, train_labels, seed=0)
    np.testing.assert_array_equal(chunk_probabilities(again, test_texts), scores)
    # max_features keeps the most frequent words: each filler word is about twice as common as "chf".
    kept = bag_of_words(train_texts, train_labels, max_features=40).named_steps["counts"].vocabulary_
    assert len(kept) == 40 and not {"chf", "noncompliance"} & set(kept)


def test_bilstm_learns_and_the_same_seed_gives_the_same_model(chunks, capsys):
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    model, vocabulary = train_bilstm(train_texts, train_labels, dev_texts=test_texts[:100],
                                     dev_labels=test_labels[:100], seed=0, **TINY_BILSTM)
    assert isinstance(model, BiLSTMClassifier) and model.vocabulary is vocabulary and not model.training
    printed = capsys.readouterr().out
    assert len(re.findall(r"epoch \d/3: train loss [\d.]+, dev AUROC [\d.]+", printed)) == 3
    scores = chunk_probabilities(model, test_texts)
    assert scores.shape == (200,) and np.all((scores > 0) & (scores < 1))
    assert roc_auc_score(test_labels[100:], scores[100:]) > 0.8  # chunks the dev choice never saw

    same, _ = train_bilstm(train_texts, train_labels, dev_texts=test_texts[:100],
                           dev_labels=test_labels[:100], seed=0, **TINY_BILSTM)
    np.testing.assert_array_equal(chunk_probabilities(same, test_texts), scores)
    other, _ = train_bilstm(train_texts, train_labels, seed=1, **{**TINY_BILSTM, "epochs": 1})
    assert not np.allclose(chunk_probabilities(other, test_texts), scores)


def test_bilstm_keeps_the_epoch_with_the_best_dev_auroc(chunks, capsys):
    # Dev labels flipped: the better the model learns, the worse its dev AUROC, so the best
    # epoch is not the last one and the returned model must be that earlier epoch.
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    dev_texts, dev_labels = test_texts[:100], 1 - test_labels[:100]
    model, _ = train_bilstm(train_texts, train_labels, dev_texts=dev_texts, dev_labels=dev_labels,
                            seed=0, **TINY_BILSTM)
    printed = [float(value) for value in re.findall(r", dev AUROC ([\d.]+)", capsys.readouterr().out)]
    assert len(printed) == 3 and np.argmax(printed) != 2
    assert roc_auc_score(dev_labels, chunk_probabilities(model, dev_texts)) == pytest.approx(max(printed), abs=1e-4)


def test_vocabulary_keeps_frequent_words_and_maps_the_rest_to_unknown():
    vocabulary = Vocabulary.build(["Chf chf stable", "CHF, stable; rare"], min_count=2)
    assert vocabulary.words == ["[PAD]", "[UNK]", "chf", "stable"]
    assert vocabulary.encode("stable rare CHF", max_words=2) == [3, Vocabulary.UNKNOWN]
    assert vocabulary.encode("", max_words=5) == [Vocabulary.UNKNOWN]


def test_inputs_are_checked_at_the_edge(chunks):
    (train_texts, train_labels), _ = chunks
    with pytest.raises(ValueError, match="one 0/1 label per chunk"):
        bag_of_words(train_texts, train_labels[:-1])
    with pytest.raises(ValueError, match="both present"):
        bag_of_words(train_texts[:3], [1, 1, 1])
    with pytest.raises(ValueError, match="together"):
        train_bilstm(train_texts, train_labels, dev_texts=train_texts)
    with pytest.raises(TypeError, match="BiLSTMClassifier"):
        chunk_probabilities(object(), ["chf"])
    with pytest.raises(ValueError, match="not a str"):
        chunk_probabilities(bag_of_words(train_texts, train_labels), ["chf", 3])


def test_admission_scores_follow_clinicalberts_formula_by_hand():
    ids = [7, 3, 7, 7, 3]
    probabilities = [0.9, 0.3, 0.2, 0.1, 0.5]
    admissions, scores = admission_scores(ids, probabilities)
    assert admissions.tolist() == [3, 7]
    # 3: max 0.5, mean 0.4, n/c = 1: (0.5 + 0.4) / 2 = 0.45. 7: max 0.9, mean 0.4, n/c = 1.5: 1.5 / 2.5 = 0.6
    np.testing.assert_allclose(scores, [0.45, 0.6])
    # c = 1 for admission 7: n/c = 3: (0.9 + 1.2) / 4 = 0.525
    assert admission_scores(ids, probabilities, c=1.0)[1][1] == pytest.approx(0.525)
    with pytest.raises(ValueError, match="1-D"):
        admission_scores(ids, np.ones((5, 2)))


def result(model, task, seed, auroc, auprc, rp80):
    return {"model": model, "task": task, "seed": seed, "auroc": auroc, "auprc": auprc, "rp80": rp80}


RESULTS = [
    result("ClinicalBERT", "early-3", 0, 0.70, 0.71, 0.20),
    result("Bag-of-words", "discharge", 0, 0.60, 0.50, 0.10),
    result("ClinicalBERT", "discharge", 0, 0.72, 0.70, 0.30),
    result("Bag-of-words", "discharge", 1, 0.65, 0.50, 0.20),
    result("ClinicalBERT", "early-3", 1, 0.68, 0.69, 0.10),
    result("Bag-of-words", "discharge", 2, 0.70, 0.50, 0.60),
    result("ClinicalBERT", "discharge", 1, 0.74, 0.72, 0.30),
    result("ClinicalBERT", "discharge", 2, 0.76, 0.74, 0.30),
    result("ClinicalBERT", "early-3", 2, 0.72, 0.70, 0.30),
]


def test_table4_rows_columns_and_mean_plus_minus_sample_sd():
    lines = table4(RESULTS).splitlines()
    assert lines[0] == ("| Model | Discharge summaries AUROC | Discharge summaries AUPRC | Discharge summaries RP80 "
                        "| 3 days AUROC | 3 days AUPRC | 3 days RP80 |")
    assert lines[1] == "|---|:---:|:---:|:---:|:---:|:---:|:---:|"
    # rp80 0.1, 0.2, 0.6: mean 0.3, squared deviations 0.14, sample sd sqrt(0.07) = 0.265 (ddof=0 would give 0.216)
    # Models in order of first appearance (ClinicalBERT's early-3 result comes first), tasks in the paper's order.
    assert lines[2] == ("| ClinicalBERT | 0.740 ± 0.020 | 0.720 ± 0.020 | 0.300 ± 0.000 "
                        "| 0.700 ± 0.020 | 0.700 ± 0.010 | 0.200 ± 0.100 |")
    assert lines[3] == "| Bag-of-words | 0.650 ± 0.050 | 0.500 ± 0.000 | 0.300 ± 0.265 | – | – | – |"
    assert "over 3 seeds per cell" in lines[5]


def test_table4_with_one_seed_and_with_uneven_seed_counts():
    one = table4([result("BERT", "early-2", 4, 0.6594, 0.656, 0.141)])
    assert one.splitlines()[2] == "| BERT | 0.659 | 0.656 | 0.141 |"
    assert "over 1 seed per cell" in one
    uneven = table4(RESULTS + [result("BERT", "discharge", 0, 0.7, 0.7, 0.1)]).splitlines()
    assert uneven[4] == "| BERT | 0.700 (n=1) | 0.700 (n=1) | 0.100 (n=1) | – | – | – |"
    assert uneven[3].startswith("| Bag-of-words | 0.650 ± 0.050 (n=3) |")


def test_table4_refuses_duplicates_and_unknown_tasks():
    with pytest.raises(ValueError, match="repeats seed 0"):
        table4(RESULTS + [RESULTS[0]])
    with pytest.raises(ValueError, match="unknown task"):
        table4([result("BERT", "early-4", 0, 0.5, 0.5, 0.0)])
    with pytest.raises(ValueError, match="lacks"):
        table4([{"model": "BERT", "task": "discharge", "seed": 0}])


def test_table4_csv(tmp_path):
    path = table4_csv(RESULTS + [result("BERT", "early-2", 0, 0.61, 0.62, 0.05)], tmp_path / "table4.csv")
    rows = list(csv.DictReader(path.open()))
    assert [(row["model"], row["task"], row["seeds"]) for row in rows] == [
        ("ClinicalBERT", "discharge", "3"), ("ClinicalBERT", "early-3", "3"),
        ("Bag-of-words", "discharge", "3"), ("BERT", "early-2", "1")]
    assert float(rows[2]["rp80_mean"]) == pytest.approx(0.3)
    assert float(rows[2]["rp80_sd"]) == pytest.approx(np.sqrt(0.07))
    assert rows[3]["auroc_mean"] == "0.61" and rows[3]["auroc_sd"] == ""


def test_plot_curves_writes_both_pngs(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 80)
    curves = {"Bag-of-words": (labels, labels + rng.normal(0, 0.8, 80)),
              "ClinicalBERT": (labels, labels + rng.normal(0, 0.5, 80))}
    roc, pr = plot_curves(curves, tmp_path / "roc.png", tmp_path / "pr.png", "Discharge summaries")
    for path in (roc, pr):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    with pytest.raises(ValueError, match="both present"):
        plot_curves({"BERT": (np.ones(4), np.ones(4))}, tmp_path / "a.png", tmp_path / "b.png", "x")
