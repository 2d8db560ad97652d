"""Readmission baselines (bag-of-words, Bi-LSTM) on synthetic chunks, admission scores, Table 4 and curves."""
import csv
import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from bertforge.cli.parser import main
from bertforge.errors import UsageError
from bertforge.readmission.baselines import (BILSTM_CONFIG, BiLSTMClassifier, Vocabulary, admission_scores,
                                             bag_of_words, bidirectional_lstm, chunk_probabilities, collate_chunks,
                                             scored_admissions, train_bilstm)
from bertforge.readmission.settings import KINDS, ReadmissionRun
from bertforge.readmission.recipe import run_readmission
from bertforge.readmission.report import plot_curves, table4, table4_csv
from bertforge.train.batches import ShuffledBatches
from bertforge.train.checkpointing import latest_checkpoint, load_trainer_state

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
    assert scores.shape == (200,) and chunk_probabilities(pipeline, []).shape == (0,)
    np.testing.assert_array_equal(chunk_probabilities(pipeline, test_texts, batch_size=7), scores)  # in slices
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


def metric_records(run_dir, key: str) -> list[dict]:
    """The records of the run's metrics.jsonl that carry `key` (the loop writes one line per log or evaluation)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if key in record]


@pytest.fixture(scope="module")
def bilstm_run(chunks, tmp_path_factory):
    """A 3-epoch Bi-LSTM run with dev data in its own folder: (model, vocabulary, folder)."""
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    folder = tmp_path_factory.mktemp("bilstm") / "run"
    model, vocabulary = train_bilstm(train_texts, train_labels, dev_texts=test_texts[:100],
                                     dev_labels=test_labels[:100], seed=0, output_dir=folder, **TINY_BILSTM)
    return model, vocabulary, folder


def test_bilstm_learns_and_the_same_seed_gives_the_same_model(chunks, bilstm_run):
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    model, vocabulary, folder = bilstm_run
    assert isinstance(model, BiLSTMClassifier) and model.vocabulary is vocabulary and not model.training
    # The one loop trained it: an evaluation per epoch (240 chunks / 16 = 15 steps), train loss and
    # accuracy in the log, at a constant learning rate.
    assert [record["step"] for record in metric_records(folder, "eval_auroc")] == [15, 30, 45]
    logged = metric_records(folder, "loss")
    assert logged[-1]["step"] == 45 and all(record["lr"] == TINY_BILSTM["lr"] for record in logged)
    assert logged[-1]["accuracy"] > 0.8 and logged[-1]["loss"] < logged[0]["loss"]
    assert (folder / "best" / BILSTM_CONFIG).is_file() and (folder / "step-000045").is_dir()
    scores = chunk_probabilities(model, test_texts)
    assert scores.shape == (200,) and np.all((scores > 0) & (scores < 1))
    assert roc_auc_score(test_labels[100:], scores[100:]) > 0.8  # chunks the dev choice never saw

    torch.manual_seed(12345)  # not the state an identical run leaves behind (the fixture's run just left it)
    generator_state = torch.get_rng_state()
    same, _ = train_bilstm(train_texts, train_labels, dev_texts=test_texts[:100],
                           dev_labels=test_labels[:100], seed=0, **TINY_BILSTM)  # in a temporary folder
    np.testing.assert_array_equal(chunk_probabilities(same, test_texts), scores)
    assert torch.equal(torch.get_rng_state(), generator_state)  # the caller's random numbers are untouched
    other, _ = train_bilstm(train_texts, train_labels, seed=1, **{**TINY_BILSTM, "epochs": 1})
    assert not np.allclose(chunk_probabilities(other, test_texts), scores)


def test_bilstm_keeps_the_epoch_with_the_best_dev_auroc(chunks, tmp_path):
    # Dev labels flipped: the better the model learns, the worse its dev AUROC, so the best
    # epoch is not the last one and the returned model must be that earlier epoch.
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    dev_texts, dev_labels = test_texts[:100], 1 - test_labels[:100]
    model, _ = train_bilstm(train_texts, train_labels, dev_texts=dev_texts, dev_labels=dev_labels,
                            seed=0, output_dir=tmp_path, **TINY_BILSTM)
    dev_aurocs = [record["eval_auroc"] for record in metric_records(tmp_path, "eval_auroc")]
    assert len(dev_aurocs) == 3 and np.argmax(dev_aurocs) != 2
    assert roc_auc_score(dev_labels, chunk_probabilities(model, dev_texts)) == pytest.approx(max(dev_aurocs), abs=1e-12)


def test_bilstm_picks_its_epoch_by_the_admissions_scores(chunks, tmp_path):
    """Dev chunks are scored as Table 4 scores test chunks, per admission (`scored_admissions`, as BERT's
    validation): eval_auroc was the chunks' AUROC, a different number from the admissions' that picked BERT's."""
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    dev_texts, admissions = test_texts[:100], np.arange(100) // 4  # 25 admissions of 4 chunks
    dev_labels = test_labels[:100][admissions * 4]  # each chunk carries its admission's label (its first chunk's)
    model, _ = train_bilstm(train_texts, train_labels, dev_texts=dev_texts, dev_labels=dev_labels,
                            dev_admissions=admissions, c=3.0, seed=0, output_dir=tmp_path,
                            **{**TINY_BILSTM, "epochs": 1})
    [logged] = metric_records(tmp_path, "eval_auroc")
    probabilities = chunk_probabilities(model, dev_texts)
    expected = scored_admissions(admissions, dev_labels, probabilities, c=3.0)["metrics"]
    assert {key: logged[f"eval_{key}"] for key in expected} == pytest.approx(expected, abs=1e-12)
    assert roc_auc_score(dev_labels, probabilities) != pytest.approx(expected["auroc"], abs=1e-3)  # rules differ
    with pytest.raises(ValueError, match="one admission id per chunk"):
        train_bilstm(train_texts, train_labels, dev_texts=dev_texts, dev_labels=dev_labels,
                     dev_admissions=admissions[:-1])


def test_bilstm_steps_are_adams_at_a_constant_rate(chunks):
    # Parity with the Bi-LSTM's own loop before the one loop: torch's Adam (the loop's eps),
    # a constant rate, no clipping, the same shuffled batches. Dropout 0, so the noise is not compared;
    # batches of 4, so that some gradients are longer than the loop's default clipping norm of 1.
    (train_texts, train_labels), _ = chunks
    settings = {**TINY_BILSTM, "epochs": 1, "batch_size": 4}
    model, vocabulary = train_bilstm(train_texts, train_labels, seed=3, dropout=0.0, **settings)

    torch.manual_seed(3)
    reference = BiLSTMClassifier(Vocabulary.build(train_texts, min_count=1), settings["embedding_dim"],
                                 settings["hidden_size"], dropout=0.0)
    assert reference.vocabulary.words == vocabulary.words
    word_ids = reference.word_ids(train_texts)
    batches = ShuffledBatches(len(word_ids), settings["batch_size"], seed=3,
                              collate=lambda rows: collate_chunks([word_ids[i] for i in rows], train_labels[rows]))
    optimizer = torch.optim.Adam(reference.parameters(), lr=settings["lr"], eps=1e-6)
    gradient_norms = []
    for _, batch in zip(range(batches.batches_per_epoch), batches):
        loss = reference(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        gradient_norms.append(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in reference.parameters()])))
        optimizer.step()
    assert max(gradient_norms) > 1.0
    trained = model.state_dict()
    for name, weight in reference.state_dict().items():
        torch.testing.assert_close(trained[name], weight, rtol=1e-5, atol=1e-6, msg=name)


def test_bidirectional_lstm_equals_the_packed_lstm_with_its_gradients():
    # The packed LSTM is the reference: each direction reads only its own sequence's words. Lengths
    # are mixed, with 1 and the full 11 among them. The upstream gradient is random, so an error in
    # either direction, or at any position, shows in the outputs or in the gradients.
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(7, 5, batch_first=True, bidirectional=True)
    lengths = torch.tensor([11, 1, 6, 11, 3, 9, 2, 7, 10, 5, 4, 8, 6])
    inputs = torch.randn(13, 11, 7)
    upstream = torch.randn(13, 11, 10)

    def outputs_and_gradients(run):
        lstm.zero_grad()
        leaf = inputs.clone().requires_grad_()
        outputs = run(leaf)
        (outputs * upstream).sum().backward()
        return outputs.detach(), {"inputs": leaf.grad, **{name: p.grad.clone() for name, p in lstm.named_parameters()}}

    def packed(leaf):
        packed_inputs = pack_padded_sequence(leaf, lengths, batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(lstm(packed_inputs)[0], batch_first=True, total_length=11)[0]

    expected, expected_gradients = outputs_and_gradients(packed)
    outputs, gradients = outputs_and_gradients(lambda leaf: bidirectional_lstm(lstm, leaf, lengths))
    assert outputs.shape == (13, 11, 10) and not outputs[1, 1:].any()
    torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-5)
    assert gradients.keys() == expected_gradients.keys() and any("reverse" in name for name in gradients)
    for name, gradient in expected_gradients.items():
        torch.testing.assert_close(gradients[name], gradient, rtol=0, atol=1e-5, msg=name)
    # The plain unpacked LSTM gives different backward states, because it starts at the padding.
    assert not torch.allclose(lstm(inputs)[0][:, :, 5:], expected[:, :, 5:], atol=1e-3)


def test_bilstm_resumes_exactly(chunks, bilstm_run, tmp_path):
    # Stopped after its first epoch, then resumed to three: the same run as one without a stop.
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    straight, _, straight_folder = bilstm_run
    dev = {"dev_texts": test_texts[:100], "dev_labels": test_labels[:100]}
    train_bilstm(train_texts, train_labels, seed=0, output_dir=tmp_path, **dev, **{**TINY_BILSTM, "epochs": 1})
    assert [record["step"] for record in metric_records(tmp_path, "eval_auroc")] == [15]
    resumed, _ = train_bilstm(train_texts, train_labels, seed=0, output_dir=tmp_path, resume=True, **dev,
                              **TINY_BILSTM)
    assert metric_records(tmp_path, "eval_auroc") == metric_records(straight_folder, "eval_auroc")
    np.testing.assert_array_equal(chunk_probabilities(resumed, test_texts), chunk_probabilities(straight, test_texts))


def test_bilstm_saves_and_loads_with_its_vocabulary(chunks, bilstm_run, tmp_path):
    _, (test_texts, _) = chunks
    model, vocabulary, _ = bilstm_run
    folder = model.save_pretrained(tmp_path / "saved")
    card = json.loads((folder / BILSTM_CONFIG).read_text())
    assert card["vocabulary"] == vocabulary.words
    assert (card["embedding_dim"], card["hidden_size"], card["max_words"]) == (16, 16, 318)
    loaded = BiLSTMClassifier.from_pretrained(folder)
    assert loaded.vocabulary.words == vocabulary.words and not loaded.training
    np.testing.assert_array_equal(chunk_probabilities(loaded, test_texts), chunk_probabilities(model, test_texts))

    with pytest.raises(TypeError, match="own vocabulary"):
        model.save_pretrained(tmp_path / "other", tokenizer=object())
    with pytest.raises(ValueError, match="holds no Bi-LSTM classifier"):
        BiLSTMClassifier.from_pretrained(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="damaged Bi-LSTM classifier"):
        BiLSTMClassifier.from_pretrained(folder)


@pytest.fixture(scope="module")
def prepared_chunks(chunks, tmp_path_factory):
    """The chunks as `readmission prepare` writes them (one chunk per admission): the data folder."""
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    data = tmp_path_factory.mktemp("readmission") / "data"
    splits = {"train": (train_texts, train_labels), "val": (test_texts[:100], test_labels[:100]),
              "test": (test_texts[100:], test_labels[100:])}
    for split, (texts, labels) in splits.items():
        path = data / "discharge" / f"{split}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as file:
            csv.writer(file).writerows([("ID", "TEXT", "Label")] + [(i, text, label) for i, (text, label)
                                                                    in enumerate(zip(texts, labels))])
    return data


def test_a_readmission_run_trains_the_bilstm_in_its_own_folder(chunks, prepared_chunks, tmp_path):
    (train_texts, train_labels), (test_texts, test_labels) = chunks
    output = tmp_path / "run"
    result = run_readmission(ReadmissionRun(data=str(prepared_chunks), kind="bilstm", output=str(output)))
    assert result["auroc"] > 0.8
    # 240 chunks in batches of 32: 8 steps an epoch, 3 epochs; the best epoch's model in best/ gives the scores.
    assert [record["step"] for record in metric_records(output, "eval_auroc")] == [8, 16, 24]
    # Settings left at ReadmissionRun's defaults (BERT's) keep the original's: Adam at a constant 1e-3.
    assert {record["lr"] for record in metric_records(output, "lr")} == {1e-3}
    best = BiLSTMClassifier.from_pretrained(output / "best")
    with open(output / "scores.csv", encoding="utf-8") as file:
        written = [float(row["score"]) for row in csv.DictReader(file)]
    np.testing.assert_allclose(written, chunk_probabilities(best, test_texts[100:]))


def test_a_bilstm_run_trains_with_the_loop_settings_it_is_given(chunks, prepared_chunks, tmp_path):
    """The command line's loop settings reach the Bi-LSTM (they were ignored: 24 steps at 1e-3, picked by AUROC);
    those left at their defaults keep the original's (a constant rate, no weight decay or clipping, fp32)."""
    output = tmp_path / "run"
    run_readmission(ReadmissionRun(data=str(prepared_chunks), kind="bilstm", output=str(output), max_steps=4,
                                   eval_every=2, best_metric="auprc", learning_rate=0.5, warmup=4, log_every=1,
                                   batch_size=16, eval_batch_size=7, tensorboard=False, plot=False, device="cpu"))
    assert [record["step"] for record in metric_records(output, "eval_auprc")] == [2, 4]
    rates = [record["lr"] for record in metric_records(output, "lr")]
    assert len(rates) == 4 and rates[0] < rates[-1] == 0.5  # 4 warm-up steps to a constant rate
    state = load_trainer_state(latest_checkpoint(output))
    assert state["best"]["metric"] == "auprc"
    assert {key: state["config"][key] for key in ("learning_rate", "warmup", "weight_decay", "schedule",
                                                  "max_grad_norm", "precision", "tensorboard")} == {
        "learning_rate": 0.5, "warmup": 4, "weight_decay": 0.0, "schedule": "constant",
        "max_grad_norm": float("inf"), "precision": "fp32", "tensorboard": False}
    assert not (output / "curves.png").exists() and not (output / "tensorboard").exists()


def test_settings_a_kind_does_not_read_are_refused(prepared_chunks, tmp_path, capsys):
    """A setting only another kind reads would train a model other than the command line says: one usage error
    naming it. A setting left at its default, or set to its default, is no setting given."""
    data, output = str(prepared_chunks), str(tmp_path / "run")
    with pytest.raises(UsageError, match="^--learning-rate applies to --kind bert and bilstm only; leave it out "
                                         "with --kind bow$"):
        ReadmissionRun(data=data, output=output, kind="bow", learning_rate=0.5)
    with pytest.raises(UsageError, match="^--no-tensorboard applies to --kind bert and bilstm only, --max-length "
                                         "applies to --kind bert only; leave them out with --kind bow$"):
        ReadmissionRun(data=data, output=output, kind="bow", max_length=128, tensorboard=False)
    for bert_only in ({"max_length": 128}, {"init_from": "some/checkpoint"}, {"precision": "bf16"}):
        with pytest.raises(UsageError, match="applies to --kind bert only; leave it out with --kind bilstm"):
            ReadmissionRun(data=data, output=output, kind="bilstm", **bert_only)
    for kind in KINDS:
        ReadmissionRun(data=data, output=output, kind=kind)
        ReadmissionRun(data=data, output=output, kind=kind, seed=3, c=3.0, eval_batch_size=16, learning_rate=2e-5,
                       max_length=512)
    ReadmissionRun(data=data, output=output, kind="bilstm", max_steps=4, warmup=0, schedule="linear", epochs=1)
    assert main(["readmission", "train", "--data", data, "--output", output, "--kind", "bow", "--eval-every",
                 "2"]) == 2
    assert capsys.readouterr().err.strip().endswith("--eval-every applies to --kind bert and bilstm only; leave it "
                                                    "out with --kind bow")
    assert not (tmp_path / "run").exists()


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
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        train_bilstm(train_texts, train_labels, epochs=0)
    with pytest.raises(ValueError, match="dev labels"):
        train_bilstm(train_texts, train_labels, dev_texts=train_texts[:4], dev_labels=[0, 1, 2, 1])
    with pytest.raises(ValueError, match="training sets seed; pass it to train_bilstm"):
        train_bilstm(train_texts, train_labels, training={"seed": 1})
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


def test_a_failed_bilstm_save_leaves_no_folder(tmp_path, monkeypatch):
    """The folder appears whole or not at all: no weights without the bilstm.json that reads them."""
    model = BiLSTMClassifier(Vocabulary(["[PAD]", "[UNK]", "discharged"]), 8, 8, 318, 0.1)

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", explode)  # fails after the weights are written
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "saved")
    assert list(tmp_path.iterdir()) == []
