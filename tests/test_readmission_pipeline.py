"""The readmission pipeline end to end on generated MIMIC-schema data: prepare -> train (bow, bilstm,
bert) -> report, and the inference path for a new admission."""
import csv
import functools
import json

import numpy as np
import pytest

from bertforge import BertForSequenceClassification, BertTokenizer
from bertforge.cli.parser import main
from bertforge.tasks.metrics import readmission_metrics
from bertforge.readmission import admission_chunks, baselines
from bertforge.readmission.recipe import Chunks, admission_risk, score_admissions


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("readmission")
    assert main(["readmission", "prepare", "--generate", "120", "--output", str(root / "data")]) == 0
    return root


@pytest.fixture(scope="module")
def trained(prepared, cassette_dir):
    runs = prepared / "runs"
    assert main(["readmission", "train", "--data", str(prepared / "data"), "--kind", "bow",
                 "--output", str(runs / "bow")]) == 0
    with pytest.MonkeyPatch.context() as patch:
        # The Bi-LSTM with its own settings (3 epochs over 318-word chunks) took ~60 s of the CPU here;
        # this module needs its scores, not its learning (test_readmission_baselines.py trains it with
        # the defaults through run_readmission): one epoch over the chunks' first 64 words.
        patch.setattr(baselines, "train_bilstm", functools.partial(baselines.train_bilstm, max_words=64))
        assert main(["readmission", "train", "--data", str(prepared / "data"), "--kind", "bilstm", "--epochs", "1",
                     "--output", str(runs / "bilstm")]) == 0
    assert main(["readmission", "train", "--data", str(prepared / "data"), "--kind", "bert", "--init-from",
                 str(cassette_dir), "--name", "bert-tiny", "--epochs", "1", "--max-length", "128",
                 "--learning-rate", "1e-4", "--output", str(runs / "bert")]) == 0
    return runs


def test_every_model_is_scored_per_admission_on_the_same_test_set(trained, prepared):
    test = Chunks.read(prepared / "data" / "discharge" / "test.csv")
    admissions, labels = test.admission_labels()
    for kind in ("bow", "bilstm", "bert"):
        result = json.loads((trained / kind / "results.json").read_text())
        with open(trained / kind / "scores.csv", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
        assert [int(r["ID"]) for r in rows] == admissions.tolist()
        assert [int(r["Label"]) for r in rows] == labels.tolist()
        recomputed = readmission_metrics(labels, np.array([float(r["score"]) for r in rows]))
        assert result["auroc"] == pytest.approx(recomputed["auroc"]) and result["rp80"] == recomputed["rp80"]
        assert result["test_admissions"] == len(admissions)
    # The bag-of-words baseline finds the generator's signal (planted phrases, with noise).
    assert json.loads((trained / "bow" / "results.json").read_text())["auroc"] > 0.6


def test_every_kind_picks_its_best_model_by_the_admissions_scores(trained, prepared):
    """best/ is picked by one validation for every kind: the validation admissions scored as the test ones
    (score_admissions). The Bi-LSTM's eval_auroc was its chunks' AUROC (23 chunks, not 6 admissions)."""
    val = Chunks.read(prepared / "data" / "discharge" / "val.csv")
    assert len(val.texts) > len(np.unique(val.admissions))  # admissions of several chunks: the rules differ
    evaluations = {kind: [json.loads(line) for line in (trained / kind / "metrics.jsonl").read_text().splitlines()
                          if "eval_auroc" in line] for kind in ("bert", "bilstm")}
    keys = {f"eval_{key}" for key in ("auroc", "auprc", "rp80", "auprc_trapezoid")}
    assert all(set(record) == keys | {"step"} for records in evaluations.values() for record in records)
    [bilstm_evaluation] = evaluations["bilstm"]  # one epoch: its model is best/
    best = baselines.BiLSTMClassifier.from_pretrained(trained / "bilstm" / "best")
    expected = score_admissions(val, baselines.chunk_probabilities(best, val.texts), c=2.0)["metrics"]
    assert {f"eval_{key}": value for key, value in expected.items()} == pytest.approx(
        {key: bilstm_evaluation[key] for key in keys}, abs=1e-12)


def test_report_writes_table_4_and_curves(trained, tmp_path, capsys):
    assert main(["readmission", "report", str(trained), "--output", str(tmp_path)]) == 0
    table = (tmp_path / "table4.md").read_text()
    for model in ("bow", "bilstm", "bert-tiny"):
        assert f"| {model} |" in table
    assert "Discharge summaries AUROC" in table
    for name in ("roc-discharge.png", "pr-discharge.png", "table4.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_report_leaves_out_other_commands_runs_and_names_a_foreign_file(trained, tmp_path, capsys):
    """runs/ held the README's sbert run too: the report stopped with "results[2] lacks ['model', 'task', ...]"."""
    import shutil

    runs = tmp_path / "runs"
    shutil.copytree(trained / "bow", runs / "bow")
    (runs / "sbert-drug-reviews").mkdir()
    (runs / "sbert-drug-reviews" / "results.json").write_text(json.dumps({"dev": {"ndcg@10": 0.3}}))
    assert main(["readmission", "report", str(runs), "--output", str(tmp_path / "report")]) == 0
    assert "| bow |" in (tmp_path / "report" / "table4.md").read_text()
    capsys.readouterr()
    assert main(["readmission", "report", str(runs / "sbert-drug-reviews"), "--output", str(tmp_path / "r2")]) == 1
    error = capsys.readouterr().err
    assert "sbert-drug-reviews/results.json is not a readmission run's results" in error
    assert len(error.splitlines()) == 1


def test_admission_score_is_clinicalberts_combination_of_its_chunks(tmp_path):
    chunks = Chunks(texts=["a", "b", "c", "d"], labels=np.array([1, 1, 1, 0]), admissions=np.array([7, 7, 7, 9]))
    scored = score_admissions(chunks, np.array([0.9, 0.2, 0.1, 0.3]), c=2.0)
    # Admission 7: Pmax 0.9, Pmean 0.4, n/c 1.5 -> (0.9 + 0.4 * 1.5) / 2.5 = 0.6; admission 9: its one chunk.
    np.testing.assert_allclose(scored["scores"], [0.6, 0.3])
    assert scored["admissions"].tolist() == [7, 9] and scored["labels"].tolist() == [1, 0]


def test_a_new_admission_is_scored_note_by_note(trained, prepared):
    model = BertForSequenceClassification.from_pretrained(trained / "bert" / "best")
    tokenizer = BertTokenizer.from_pretrained(trained / "bert" / "best")
    with open(prepared / "data" / "discharge" / "test.csv", encoding="utf-8") as file:
        texts = [row["TEXT"] for row in csv.DictReader(file)][:3]
    notes = [texts[0], "[**2151-7-16**] 1. nothing new", " ".join(texts[1:])]
    trace = admission_risk(model, tokenizer, notes, c=2.0, max_length=128)
    assert len(trace.risks) == 3 and all(0 <= risk <= 1 for risk in trace.risks)
    probabilities = np.array(trace.chunk_probabilities)
    n = len(probabilities)
    expected = (probabilities.max() + probabilities.mean() * n / 2) / (1 + n / 2)
    assert trace.risks[-1] == pytest.approx(expected)
    chunks = admission_chunks(notes)  # as prepare chunks an admission
    assert len(chunks) == n and trace.top_chunk == chunks[int(probabilities.argmax())]
    with pytest.raises(ValueError, match="no words"):
        admission_risk(model, tokenizer, ["   ", "[** **]"])


def test_evaluate_and_predict_read_chunks_at_the_length_the_model_was_trained_on(trained, prepared, capsys):
    """A model trained on chunks cut at 128 pieces was scored at 512 by `readmission evaluate` (its default), and
    `predict` / `serve --classifier` knew nothing of how it read: its best/ had no task.json."""
    from bertforge.tasks.finetune import prediction_task

    best = trained / "bert" / "best"
    task, _ = prediction_task(best)
    assert task.max_length == 128 and task.settings.max_windows == 1 and task.settings.combine == "clinical"
    capsys.readouterr()
    assert main(["readmission", "evaluate", "--model", str(best), "--data", str(prepared / "data")]) == 0
    printed = dict(part.split()[:2] for part in capsys.readouterr().out.split(" on ")[0].split(", "))
    result = json.loads((trained / "bert" / "results.json").read_text())
    assert float(printed["auroc"]) == pytest.approx(result["auroc"], abs=1e-4)


def test_score_command_says_no_risk_yet_for_a_first_note_too_short_for_a_chunk(trained, prepared, tmp_path, capsys):
    """The risk after a note of <= 10 words is None (no chunk yet): the command printed it with `:.3f`."""
    with open(prepared / "data" / "discharge" / "test.csv", encoding="utf-8") as file:
        text = next(csv.DictReader(file))["TEXT"]
    (tmp_path / "short.txt").write_text("Patient seen, stable.", encoding="utf-8")
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["readmission", "score", str(tmp_path / "short.txt"), str(tmp_path / "long.txt"),
                 "--model", str(trained / "bert" / "best")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"after {tmp_path / 'short.txt'}: no risk yet")
    assert lines[1].startswith(f"after {tmp_path / 'long.txt'}: risk 0.") and lines[2].startswith("highest-scoring")


def test_a_max_length_past_the_checkpoints_positions_is_refused_before_training(prepared, cassette_dir, tmp_path,
                                                                               capsys):
    """--max-length 1024 on a 512-position checkpoint loaded the model, started training and failed at step 0."""
    code = main(["readmission", "train", "--data", str(prepared / "data"), "--kind", "bert", "--init-from",
                 str(cassette_dir), "--max-length", "1024", "--output", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert code == 2 and "--max-length must be at most 512, got 1024" in error
    assert not (tmp_path / "run").exists()  # refused before the run folder was claimed


def test_results_json_records_the_settings_each_kind_used(trained):
    """bow's and bilstm's results.json recorded BERT's defaults (lr 2e-5, warm-up 0.1, weight decay 0.01) while the
    Bi-LSTM trained at 1e-3, constant, and bag-of-words trained no network and scored at its own batch size."""
    bow = json.loads((trained / "bow" / "results.json").read_text())["run"]
    assert "learning_rate" not in bow and bow["kind"] == "bow" and bow["eval_batch_size"] == 256
    bilstm = json.loads((trained / "bilstm" / "results.json").read_text())["run"]
    assert "learning_rate" not in bilstm
    assert (bilstm["training"]["learning_rate"], bilstm["training"]["warmup"]) == (1e-3, 0)
    assert bilstm["training"]["schedule"] == "constant" and bilstm["training"]["weight_decay"] == 0.0
    bert = json.loads((trained / "bert" / "results.json").read_text())["run"]
    assert (bert["learning_rate"], bert["max_length"]) == (1e-4, 128)


def test_evaluate_and_score_combine_with_the_c_the_model_was_trained_with(trained, prepared, tmp_path, capsys):
    """A model trained with --c 4 records combine_c 4 in its task.json (results.json and predict use it);
    `readmission evaluate` and `score` combined its chunks with 2 (AUROC 0.625 against its run's 0.500)."""
    import shutil

    best = shutil.copytree(trained / "bert" / "best", tmp_path / "c4")
    card = json.loads((best / "task.json").read_text())
    card["data"]["combine_c"] = 4.0
    (best / "task.json").write_text(json.dumps(card))

    def printed(*argv):
        capsys.readouterr()
        assert main(["readmission", *argv]) == 0
        return capsys.readouterr().out

    data = ["--data", str(prepared / "data")]
    original = str(trained / "bert" / "best")
    assert printed("evaluate", "--model", str(best), *data) == printed("evaluate", "--model", original, *data,
                                                                        "--c", "4")
    assert printed("evaluate", "--model", str(best), *data, "--c", "2") == printed("evaluate", "--model", original,
                                                                                   *data)
    chunks = Chunks.read(prepared / "data" / "discharge" / "test.csv")
    note = tmp_path / "note.txt"
    note.write_text(" ".join(chunks.texts[:3]), encoding="utf-8")
    assert printed("score", str(note), "--model", str(best)) == printed("score", str(note), "--model", original,
                                                                        "--c", "4")


def test_a_split_of_one_class_is_refused_before_training_naming_the_split(prepared, tmp_path, capsys):
    """A test split of one class (AUROC undefined) was found after every epoch had trained, and the message named
    neither the split nor the cause."""
    import shutil

    data = shutil.copytree(prepared / "data", tmp_path / "data")
    test_file = data / "discharge" / "test.csv"
    rows = list(csv.DictReader(test_file.open(encoding="utf-8")))
    with test_file.open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**row, "Label": "0"} for row in rows)
    capsys.readouterr()
    assert main(["readmission", "train", "--data", str(data), "--kind", "bow", "--output", str(tmp_path / "run")]) == 1
    error = capsys.readouterr().err
    assert "test split has label 0" in error and "Traceback" not in error
    assert not (tmp_path / "run" / "results.json").exists()
