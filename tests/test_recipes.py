"""Recipes: one way to load them, one rule for their paths, one rule for their keys, and the recipe runner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bertforge.errors import UsageError
from bertforge.readmission.settings import ReadmissionRun
from bertforge.settings import load_recipe
from bertforge.tasks.finetune import FinetuneRecipe
from bertforge.tasks.pretraining.recipe import PretrainRecipe
from bertforge.tasks.retrieval.recipe import SbertRecipe
from bertforge.train.config import TrainConfig
from bertforge.train.loop import train
from bertforge.train.runner import RESULTS_FILE, run_recipe

from cli_run import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- unknown keys

@pytest.mark.parametrize("argv, key, nearest", [
    (["pretrain", "--config", "{recipe}", "model.overrides.hidden_sizee=5"], "recipe.model.overrides.hidden_sizee",
     "hidden_size"),
    (["finetune", "--data", "x.csv", "model_overrides.hidden_dropout_probb=0.2"],
     "recipe.model_overrides.hidden_dropout_probb", "hidden_dropout_prob"),
])
def test_a_misspelled_model_override_is_refused_with_the_nearest_name(tmp_path, argv, key, nearest):
    """It was ignored: the run trained to exit 0 with the model it would have had without it."""
    recipe = write(tmp_path / "r.yaml", "data:\n  train: [a.txt]\n")
    argv = [word.format(recipe=recipe) for word in argv]
    line = assert_one_line_error(*run_cli(*argv, "--print-config")[::2], codes=(2,))
    assert f"unknown setting {key}; did you mean '{nearest}'?" in line


def test_a_misspelled_model_override_in_the_file_is_refused_too(tmp_path):
    recipe = write(tmp_path / "r.yaml", "model:\n  overrides:\n    num_hidden_layer: 2\ndata:\n  train: [a.txt]\n")
    with pytest.raises(UsageError, match="recipe.model.overrides.num_hidden_layer; did you mean 'num_hidden_layers'"):
        PretrainRecipe.from_file(recipe)
    overrides = PretrainRecipe.from_file(recipe, ["model.overrides={num_hidden_layers: '2'}"]).model.overrides
    assert overrides == {"num_hidden_layers": 2}  # known keys are converted to the field's type, as elsewhere


# ---------------------------------------------------------------- one rule for paths

def test_paths_in_the_file_follow_the_file_and_paths_on_the_command_line_the_working_folder(tmp_path, monkeypatch):
    """training.output_dir resolved against the working folder while data.train followed the recipe's folder."""
    recipes, work = tmp_path / "recipes", tmp_path / "work"
    (recipes / "checkpoint").mkdir(parents=True)
    work.mkdir()
    recipe = write(recipes / "r.yaml", "init_from: checkpoint\ndata:\n  train: a.csv\n  dev: ../dev.csv\n"
                                       "training:\n  output_dir: runs/x\n")
    monkeypatch.chdir(work)
    loaded = load_recipe(FinetuneRecipe, recipe)
    assert (loaded.training.output_dir, loaded.data.train, loaded.data.dev, loaded.init_from) == (
        str(recipes / "runs" / "x"), str(recipes / "a.csv"), str(tmp_path / "dev.csv"), str(recipes / "checkpoint"))
    given = load_recipe(FinetuneRecipe, recipe, {"data.test": "t.csv"}, ["training.output_dir=out", "data.train=b.csv"])
    assert (given.training.output_dir, given.data.train, given.data.test) == (
        str(work / "out"), str(work / "b.csv"), str(work / "t.csv"))
    assert load_recipe(FinetuneRecipe).training.output_dir == str(work / "runs" / "finetune")  # a default: here
    assert load_recipe(FinetuneRecipe, recipe, overrides=["init_from=minilm"]).init_from == "minilm"  # a short name


def test_a_printed_recipe_runs_the_same_from_another_folder(tmp_path, monkeypatch):
    recipe = write(tmp_path / "a" / "r.yaml", "data:\n  train: [t.txt]\ntraining:\n  output_dir: run\n")
    monkeypatch.chdir(tmp_path)
    code, printed, err = run_cli("pretrain", "--config", recipe, "--print-config")
    assert code == 0, err
    moved = write(tmp_path / "b" / "c" / "printed.yaml", printed)
    again = PretrainRecipe.from_file(moved)
    assert (again.training.output_dir, again.data.train) == (str(tmp_path / "a" / "run"), [str(tmp_path / "a" / "t.txt")])


@pytest.mark.parametrize("name", sorted(path.name for path in (ROOT / "recipes").glob("*.yaml")))
def test_the_committed_recipes_write_under_the_repository_from_any_folder(name, tmp_path, monkeypatch):
    """README runs them from the repository root: their runs/ and data/ are the root's, wherever one stands."""
    monkeypatch.chdir(tmp_path)
    cls = SbertRecipe if name.startswith("sbert") else PretrainRecipe
    recipe = cls.from_file(ROOT / "recipes" / name)
    assert str(recipe.training.output_dir).startswith(str(ROOT / "runs"))
    train = recipe.data.train if isinstance(recipe.data.train, list) else [recipe.data.train]
    assert all(path.startswith(str(ROOT / "data")) or path.startswith(str(ROOT / "runs")) for path in train)


# ---------------------------------------------------------------- max_steps

def test_zero_steps_where_nothing_counts_epochs_is_a_usage_error(tmp_path):
    """pretrain training.max_steps=0 exited 1 from inside the loop; a setting out of range exits 2."""
    recipe = write(tmp_path / "r.yaml", "data:\n  train: [a.txt]\n")
    line = assert_one_line_error(*run_cli("pretrain", "--config", recipe, "training.max_steps=0", "--print-config")[::2],
                                 codes=(2,))
    assert "recipe.training.max_steps must be at least 1, got 0" in line
    with pytest.raises(UsageError, match="training.max_steps must be at least 1"):
        train(None, [], TrainConfig(output_dir=str(tmp_path / "run"), max_steps=0))


# ---------------------------------------------------------------- readmission's training fields

def test_readmission_train_takes_the_loops_settings_as_a_recipe_does(tmp_path):
    for split in ("train", "val", "test"):
        write(tmp_path / "data" / "discharge" / f"{split}.csv", "ID,TEXT,Label\n")
    code, printed, err = run_cli("readmission", "train", "--data", tmp_path / "data", "--output", tmp_path / "run",
                                 "--warmup", "0.2", "--precision", "fp32", "--early-stopping-patience", "2",
                                 "--print-config")
    assert code == 0, err
    values = yaml.safe_load(printed)
    run = ReadmissionRun(**{key: value for key, value in values.items() if key not in ("overwrite", "threads")})
    config = run.training_config()
    assert type(config) is TrainConfig and (config.output_dir, config.warmup, config.precision) == (
        str(tmp_path / "run"), 0.2, "fp32")
    assert (config.learning_rate, config.max_steps, config.best_metric) == (2e-5, 0, "auroc")  # ClinicalBERT's
    line = assert_one_line_error(*run_cli("readmission", "train", "--data", tmp_path / "data", "--output", "a",
                                          "--output-dir", "b")[::2], codes=(2,))
    assert "--output" in line


def test_every_fine_tuning_run_starts_from_the_one_set_of_fine_tuning_values(tmp_path):
    """finetune, sbert train and readmission train declare BERT's fine-tuning values once (FinetuningConfig)."""
    for split in ("train", "val", "test"):
        write(tmp_path / "data" / "discharge" / f"{split}.csv", "ID,TEXT,Label\n")
    readmission = ReadmissionRun(data=str(tmp_path / "data"), output=str(tmp_path / "run")).training_config()
    keys = ("max_steps", "learning_rate", "warmup", "weight_decay", "keep_last", "eval_at_start")
    values = [tuple(getattr(config, key) for key in keys)
              for config in (FinetuneRecipe().training, SbertRecipe().training, readmission)]
    assert values[0] == values[2] == (0, 2e-5, 0.1, 0.01, 1, False)
    assert values[1] == (0, 2e-5, 0.1, 0.01, 1, True)  # sbert scores the starting model first
    assert (FinetuneRecipe().training.output_dir, SbertRecipe().training.output_dir) == ("runs/finetune", "runs/sbert")


# ---------------------------------------------------------------- the runner

def test_the_runner_writes_results_last_and_only_for_a_finished_run(tmp_path):
    training = TrainConfig(output_dir=str(tmp_path / "run"))

    def fails(run):
        raise ValueError("bad data")

    with pytest.raises(ValueError, match="bad data"):
        run_recipe(training, fails)
    assert not (tmp_path / "run").exists()  # the folder the claim made is gone: nothing was run there
    seen = {}

    def body(run):
        seen.update(folder=run.folder, tokenizer=run.tokenizer, device=run.device.type)
        return {"test": {"accuracy": 0.5}}

    assert run_recipe(training, body) == {"test": {"accuracy": 0.5}}
    assert json.loads((tmp_path / "run" / RESULTS_FILE).read_text()) == {"test": {"accuracy": 0.5}}
    assert seen["folder"] == tmp_path / "run" and seen["tokenizer"] is None
    with pytest.raises(UsageError, match="already holds a run"):  # the run folder policy: one run per folder
        run_recipe(training, body)


def test_a_section_given_in_part_or_left_empty_keeps_the_tasks_defaults(tmp_path):
    """Finetuning's own training defaults (lr 2e-5, steps from epochs), not TrainConfig's pretraining ones."""
    for text in ("training:\n", "training:\n  seed: 3\n"):
        recipe = load_recipe(FinetuneRecipe, write(tmp_path / "r.yaml", "data:\n  train: a.csv\n" + text))
        assert (recipe.training.learning_rate, recipe.training.max_steps, recipe.training.keep_last) == (2e-5, 0, 1)
