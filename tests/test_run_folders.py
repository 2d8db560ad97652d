"""Whose run an output folder holds, what --overwrite may remove, and what a failed or killed run leaves.

Each test is one of the audit's reproductions (a user's data/ deleted by --overwrite, sbert train resuming a
finetune run, a run written into an index, a max_length past the position table found mid-run, a JSONL file
rewritten in place) on tiny CSVs and the bert-tiny checkpoint, a step or two each.
"""
from __future__ import annotations

import json
import shutil

import pytest

from bertforge.adapt import stages
from bertforge.adapt.pseudo_queries import whole_lines
from bertforge.errors import UsageError
from bertforge.models.heads import BertForSequenceClassification
from bertforge.search import folder as index_folder
from bertforge.tasks.pretraining import shards
from bertforge.train import run_folder
from bertforge.train.checkpointing import list_checkpoints
from bertforge.train.run_folder import RUN_RECORD, claim_run_folder
from bertforge.train.run_log import METRICS_FILE, RunLog

from cli_run import assert_one_line_error, run_cli
from hostile_files import file_size_limit

TRAINING = ["training.max_steps=1", "training.tensorboard=false", "training.plot=false"]


@pytest.fixture
def labelled(tmp_path):
    """proj/data/train.csv: the user's own training file, inside the folder the runs are written to."""
    data = tmp_path / "proj" / "data"
    data.mkdir(parents=True)
    (data / "train.csv").write_text("text,label\n" + "".join(f"good film {i},pos\nbad film {i},neg\n"
                                                             for i in range(4)))
    return data / "train.csv"


def finetune(data, output, cassette_dir, *options):
    return run_cli("finetune", "--data", data, "--init-from", cassette_dir, "--output", output, *TRAINING, *options)


def tree(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != run_folder.LOCK_FILE}


# ---------------------------------------------------------------- 1. --overwrite removes only what the run made

def test_overwrite_keeps_the_users_data_and_tokenizer_folders(labelled, cassette_dir):
    """--overwrite deleted proj/data (the CSVs the run reads) and proj/tokenizer in every training command."""
    project = labelled.parents[1]
    (project / "tokenizer").mkdir()
    (project / "tokenizer" / "vocab.txt").write_text("[PAD]\nmine\n")
    assert finetune(labelled, project, cassette_dir)[0] == 0
    code, _, err = finetune(labelled, project, cassette_dir, "--overwrite")
    assert code == 0, err
    assert labelled.is_file() and (project / "tokenizer" / "vocab.txt").read_text() == "[PAD]\nmine\n"
    assert json.loads((project / RUN_RECORD).read_text())["command"] == "bertforge finetune"


def test_overwrite_removes_only_the_caches_its_command_made(tmp_path):
    """pretrain owns tokenizer/ and data/ where it made them; a data/ that was there before is the user's."""
    run, caches = tmp_path / "run", ("tokenizer", "data")
    (run / "data").mkdir(parents=True)
    (run / "data" / "corpus.txt").write_text("the user's text\n")
    with claim_run_folder(run, command="bertforge pretrain", caches=caches) as folder:
        (folder / "tokenizer").mkdir()
        (folder / "tokenizer" / "vocab.txt").write_text("[PAD]\n")
        (folder / "data" / "train").mkdir()
        (folder / METRICS_FILE).write_text('{"step": 1, "loss": 1.0}\n')
    assert json.loads((run / RUN_RECORD).read_text())["caches"] == ["tokenizer"]
    with claim_run_folder(run, command="bertforge pretrain", caches=caches, overwrite=True):
        assert not (run / "tokenizer").exists() and not (run / METRICS_FILE).exists()
        assert (run / "data" / "corpus.txt").read_text() == "the user's text\n"


# ---------------------------------------------------------------- 2. one command's runs per folder

def test_a_folder_holding_another_commands_run_is_refused(labelled, cassette_dir):
    """sbert train --resume into a finetune run passed over its checkpoint as damaged, started at step 0 and
    let keep_last delete its own checkpoint; --overwrite is refused too (it is not that command's run)."""
    run = labelled.parents[1] / "run"
    assert finetune(labelled, run, cassette_dir)[0] == 0
    before = tree(run)
    recipe = labelled.parent / "sbert.yaml"
    recipe.write_text(f"init_from: {cassette_dir}\nmax_length: 16\ndata:\n  train: {labelled}\n")
    for flag in ("--resume", "--overwrite", None):
        line = assert_one_line_error(*run_cli("sbert", "train", "--config", recipe, "--output", run, *TRAINING,
                                              *filter(None, [flag]))[::2], codes=(2,))
        assert "holds a run of bertforge finetune, not of bertforge sbert train" in line
        assert "another output folder" in line
    assert tree(run) == before


@pytest.mark.parametrize("kind", ["index", "adapt", "corpus", "checkpoint"])
def test_another_kind_of_output_is_refused_and_left_untouched(labelled, cassette_dir, kind):
    """finetune wrote its checkpoints, metrics and best/ into an `index build` folder (or a model's) without
    complaint."""
    output = labelled.parents[1] / kind
    if kind == "index":  # a real one (`index build` makes its folder)
        (labelled.parent / "passages.txt").write_text("the cat sat on the mat\nrain is forecast today\n")
        assert run_cli("index", "build", labelled.parent / "passages.txt", "--output", output,
                       "--model", cassette_dir)[0] == 0
    elif kind == "adapt":
        output.mkdir()
        (output / stages.MARKER).write_text("{}\n")
    elif kind == "checkpoint":  # the model it starts from, given as --output by mistake
        shutil.copytree(cassette_dir, output)
    else:
        output.mkdir()
        (output / "tokens.bin").write_bytes(b"\0\0")
    before = sorted(p.name for p in output.iterdir())
    line = assert_one_line_error(*finetune(labelled, output, cassette_dir)[::2], codes=(2,))
    assert "not a run folder; give bertforge finetune a new or empty output folder" in line
    assert sorted(p.name for p in output.iterdir()) == before  # not even a lock file


def test_the_marks_of_other_outputs_are_their_owners(tmp_path):
    """train/ cannot import search/, adapt/ or tasks/: its literals must follow theirs."""
    assert (run_folder.INDEX_META, run_folder.INDEX_FORMAT) == (index_folder.META_FILE, index_folder.FORMAT)
    assert run_folder.ADAPT_MARKER == stages.MARKER and run_folder.CORPUS_TOKENS in shards.FILES


def test_a_run_folder_from_before_records_still_resumes(labelled, cassette_dir):
    run = labelled.parents[1] / "run"
    assert finetune(labelled, run, cassette_dir)[0] == 0
    (run / RUN_RECORD).unlink()  # as every run folder made before the record was
    code, _, err = finetune(labelled, run, cassette_dir, "--resume", "training.max_steps=2")
    assert code == 0, err
    assert [c.name for c in list_checkpoints(run)] == ["step-000002"] and not (run / RUN_RECORD).exists()


# ---------------------------------------------------------------- 3. fail before the folder, or leave it reusable

def test_a_max_length_past_the_position_table_is_refused_before_the_folder(labelled, cassette_dir):
    """finetune failed in the forward pass, after claiming the folder, and its empty metrics.jsonl refused the
    corrected command; embed and sbert train refused before any work."""
    run, long = labelled.parents[1] / "run", labelled.with_name("long.csv")
    long.write_text(f"text,label\n{' '.join(['film'] * 700)},pos\nbad film,neg\n")  # 700 pieces: a 702 window
    line = assert_one_line_error(*finetune(long, run, cassette_dir, "data.max_length=1000")[::2], codes=(2,))
    assert "data.max_length must be at most 512, got 1000" in line
    assert not run.exists()



def test_a_tasks_standard_length_past_the_position_table_is_refused_before_the_folder(cassette_dir, tmp_path):
    """data.max_length 0 takes the task's standard length (qa: 384), which a 256-position model cannot hold."""
    import torch

    from bertforge import BertConfig, BertForQuestionAnswering, BertTokenizer
    from bertforge.tasks.finetune import FinetuneRecipe, check_length_fits

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=256)
    BertForQuestionAnswering(config).save_pretrained(tmp_path / "short",
                                                     tokenizer=BertTokenizer.from_pretrained(cassette_dir))
    recipe = FinetuneRecipe.from_values({"task": "qa", "init_from": str(tmp_path / "short")}, base=tmp_path)
    with pytest.raises(UsageError, match=r"0: the qa standard 384.*must be at most 256, got 384"):
        check_length_fits(recipe)
    check_length_fits(FinetuneRecipe.from_values({"task": "classification", "init_from": str(tmp_path / "short")},
                                                 base=tmp_path))  # its standard 128 fits

def test_a_run_that_fails_before_its_first_step_leaves_a_folder_a_rerun_accepts(labelled, cassette_dir,
                                                                               monkeypatch):
    project = labelled.parents[1]

    def fails(*args, **kwargs):
        raise ValueError("the forward pass failed")

    with monkeypatch.context() as patch:
        patch.setattr(BertForSequenceClassification, "forward", fails)
        assert "forward pass failed" in assert_one_line_error(*finetune(labelled, project, cassette_dir)[::2])
    assert sorted(p.name for p in project.iterdir() if p.name != run_folder.LOCK_FILE) == ["data"]
    code, _, err = finetune(labelled, project, cassette_dir)
    assert code == 0, err


def test_a_failed_run_that_got_past_its_start_is_kept(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError), claim_run_folder(run, command="bertforge finetune"):
        RunLog(run, tensorboard=False).write({"step": 1, "loss": 0.5})
        raise RuntimeError("step 2 failed")
    assert (run / METRICS_FILE).read_text() == '{"step": 1, "loss": 0.5}\n'
    assert json.loads((run / RUN_RECORD).read_text())["command"] == "bertforge finetune"


def test_a_failed_start_keeps_the_record_of_the_caches_it_made(tmp_path):
    """pretrain killed while it tokenizes: no run to refuse a rerun, but its caches stay its own (not the user's)."""
    run, caches = tmp_path / "run", ("tokenizer", "data")
    with pytest.raises(KeyboardInterrupt), claim_run_folder(run, command="bertforge pretrain", caches=caches):
        (run / "tokenizer").mkdir()
        RunLog(run, tensorboard=False)
        raise KeyboardInterrupt
    assert sorted(p.name for p in run.iterdir()) == sorted([run_folder.LOCK_FILE, RUN_RECORD, "tokenizer"])
    assert json.loads((run / RUN_RECORD).read_text())["caches"] == ["tokenizer"]
    with pytest.raises(UsageError, match="holds a run of bertforge pretrain, not of bertforge finetune"), \
            claim_run_folder(run, command="bertforge finetune"):
        pass
    with claim_run_folder(run, command="bertforge pretrain", caches=caches):
        assert json.loads((run / RUN_RECORD).read_text())["caches"] == ["tokenizer", "data"]


# ---------------------------------------------------------------- 4. a JSONL file is rewritten whole or not at all

def test_cutting_a_partial_last_line_never_loses_the_whole_ones(tmp_path):
    """whole_lines(cut=True) rewrote the queries file in place: a failure halfway lost the records it kept."""
    path = tmp_path / "queries.jsonl"
    lines = [json.dumps({"passage": i, "queries": [f"query {i}"]}) for i in range(100)]
    text = "".join(line + "\n" for line in lines) + '{"passage": 100, "que'
    path.write_text(text)
    with pytest.raises(OSError), file_size_limit(len(text) // 2):
        whole_lines(path, cut=True)
    assert path.read_text() == text and not [p for p in tmp_path.iterdir() if p != path]
    assert whole_lines(path, cut=True) == lines and path.read_text() == "".join(line + "\n" for line in lines)


def test_a_resumed_metrics_log_is_rewritten_whole_or_not_at_all(tmp_path):
    text = "".join(json.dumps({"step": step, "loss": 1.0}) + "\n" for step in range(1, 101))
    (tmp_path / METRICS_FILE).write_text(text)
    with pytest.raises(OSError), file_size_limit(len(text) // 2):
        RunLog(tmp_path, resume_step=90, tensorboard=False)
    assert (tmp_path / METRICS_FILE).read_text() == text
    assert [r["step"] for r in RunLog(tmp_path, resume_step=90, tensorboard=False).records()] == list(range(1, 91))
