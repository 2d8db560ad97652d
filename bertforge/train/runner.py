"""The recipe runner: a checkpoint trained by the one loop in a run folder, its best model kept, its results written.

Every recipe that trains from a checkpoint (finetune, sbert train, readmission train, adapt) is
the same steps around its own data, model class and metrics; they are written once here:

    def run_my_recipe(recipe, resume=False, overwrite=False) -> dict:
        return run_recipe(recipe.training, lambda run: my_recipe_in(recipe, run), init_from=recipe.init_from,
                          resume=resume, overwrite=overwrite, recipe=recipe)   # recipe: checked on --resume

    def my_recipe_in(recipe, run: RecipeRun) -> dict:
        model = run.build(MyModel, **options)                 # from run.init_from; fresh heads from the seed
        batches = run.batches(len(rows), recipe.batch_size, collate)   # this process's share under torchrun
        config = run.schedule(batches, recipe.epochs, has_dev=..., default_metric="accuracy")
        final = run.fit(model, batches, config, evaluate=dev_metrics_or_None)   # the best (or last) model
        return {"steps": config.max_steps, "test": score(final)}               # -> output_dir/results.json

`run_recipe` claims training.output_dir (`train.run_folder`: a new run, --resume or --overwrite,
one run at a time), hands the body a `RecipeRun` (the checkpoint's folder and tokenizer, the
device), and writes what the body returns to output_dir/results.json, last: a results file
marks a finished run. `RecipeRun.fit` is the loop (`train.loop.train`) followed by the best
model: with an `evaluate` the best one by the dev metric (train/best.py), without one the last
one, saved to output_dir/best (HF or sentence-transformers layout, tokenizer included) and
loaded back from there, so what the body scores is exactly what ships.

Under torchrun every process runs the body: `run.batches` gives each its share of every step, the loop
keeps the copies in step (DistributedDataParallel: gloo on the CPU, NCCL on GPUs) and evaluates and saves
on rank 0. After training, what a recipe does next (scoring the test split, writing files) is rank 0's
alone: `fit` ends the body on the other processes, whose `run_recipe` returns {}.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..atomic import write_text
from ..engine.devices import select_device
from ..models.folder import read_model_folder
from ..resources import resolve_model
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer
from .batches import ShuffledBatches
from .best import best_model_folder
from .distributed import Topology, barrier, process_group
from .loop import TrainConfig, train
from .optim import epoch_schedule
from .resume import run_inputs
from .run_folder import PYTHON_API, claim_run_folder

RESULTS_FILE = "results.json"
Evaluate = Callable[[torch.nn.Module], dict[str, float]]


@dataclass
class RecipeRun:
    """One run of a recipe in its claimed folder: where it starts from, on which device, and how it trains.

    init_from (a checkpoint folder or a packaged short name) is resolved to its folder and its
    tokenizer loaded as every command loads a folder's (`tokenization.folder.load_tokenizer`: a
    sentence-transformers module's subfolder, its lower-casing); a run without a checkpoint
    (readmission's bag-of-words) leaves both None.
    """

    training: TrainConfig
    init_from: str | None = None
    resume: bool = False
    device: torch.device | None = None  # None: training.device's (`engine.devices.select_device`)
    topology: Topology = field(default_factory=Topology)
    inputs: dict | None = None  # what the run is made of besides `training` (`resume.run_inputs`), checked on resume
    tokenizer: BertTokenizer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.device = self.device or select_device(self.training.device)
        if self.init_from:
            self.init_from = str(resolve_model(self.init_from))
            self.tokenizer = load_tokenizer(read_model_folder(self.init_from))

    @property
    def folder(self) -> Path:
        return Path(self.training.output_dir)

    @property
    def best_folder(self) -> Path:
        return best_model_folder(self.folder)

    def build(self, model_class, **options):
        """model_class.from_pretrained(init_from, **options), its fresh heads drawn from training.seed
        (the same seed gives the same head)."""
        torch.manual_seed(self.training.seed)
        return model_class.from_pretrained(self.init_from, **options)

    def batches(self, size: int, batch_size: int, collate, seed: int | None = None) -> ShuffledBatches:
        """Shuffled batches of `size` examples (seed: training.seed), this process's share under torchrun."""
        return ShuffledBatches(size, batch_size, collate, seed=self.training.seed if seed is None else seed,
                               rank=self.topology.rank, world_size=self.topology.world_size)

    def schedule(self, batches: ShuffledBatches, epochs: float, *, has_dev: bool, default_metric: str) -> TrainConfig:
        """The recipe's training settings counted in epochs of `batches` (`train.optim.epoch_schedule`)."""
        return epoch_schedule(self.training, epochs, batches.batches_per_epoch, has_dev=has_dev,
                              default_metric=default_metric)

    def fit(self, model: torch.nn.Module, batches, config: TrainConfig, evaluate: Evaluate | None = None,
            **loop_options: Any) -> torch.nn.Module:
        """Train `model` with the one loop, then return the model that ships, loaded from output_dir/best.

        With `evaluate` (dev metrics) the loop keeps the best model there by config.best_metric;
        without one (or when no evaluation ever gave a finite score) the last model is saved there,
        over any earlier run's. loop_options go to `train` (statistics, forward_kwargs).
        """
        train(model, batches, config, evaluate=evaluate, tokenizer=self.tokenizer, device=self.device,
              resume=self.resume, topology=self.topology, inputs=self.inputs, **loop_options)
        if self.topology.is_main and (evaluate is None or not self.best_folder.is_dir()):
            model.save_pretrained(self.best_folder, tokenizer=self.tokenizer)  # the loop kept no best: the last
        barrier(self.topology)
        if not self.topology.is_main:
            raise TrainedOnAnotherRank
        return type(model).from_pretrained(self.best_folder).to(self.device)


class TrainedOnAnotherRank(Exception):
    """Raised by `fit` on every torchrun process but rank 0 once training is over; `run_recipe` takes it."""


def run_recipe(training: TrainConfig, body: Callable[[RecipeRun], dict], *, init_from: str | None = None,
               resume: bool = False, overwrite: bool = False, command: str = PYTHON_API, recipe=None) -> dict:
    """Claim training.output_dir, run `body` in it, write what it returns to output_dir/results.json; return it.

    recipe: the recipe dataclass the body runs: its settings, data files and init_from are recorded in every
    checkpoint (`resume.run_inputs`), and --resume is refused when they changed (`resume.check_resumable`; without
    a recipe only training and init_from are checked).

    command: the command the run record names ("bertforge finetune"); a folder holding another command's run
    is refused. Raises UsageError / BertforgeError from the claim (`train.run_folder.claim_run_folder`) before
    anything is loaded; whatever `body` raises leaves no results file (the run did not finish).
    """
    device = select_device(training.device)
    with process_group(device) as topology, \
            claim_run_folder(training.output_dir, command=command, resume=resume, overwrite=overwrite,
                             enabled=topology.is_main):
        try:
            results = body(RecipeRun(training, init_from, resume, device, topology, run_inputs(recipe, init_from)))
        except TrainedOnAnotherRank:
            return {}
        write_results(training.output_dir, results)
        return results


def write_results(folder: str | Path, results: dict) -> None:
    write_text(Path(folder) / RESULTS_FILE, json.dumps(results, indent=2) + "\n")


def run_summary(results: dict, training: TrainConfig, shipped: str = "best model") -> list[str]:
    """What a recipe command prints after a run: the splits' metrics, then where the model that ships is."""
    return [*split_metrics(results), f"{shipped}: {best_model_folder(training.output_dir)}"]


def split_metrics(results: dict) -> list[str]:
    """The held-out splits' metrics of a run's results, a line per split: `dev: accuracy 0.8123, f1 0.7990`."""
    return [f"{split}: " + ", ".join(f"{k} {v:.4f}" for k, v in results[split].items())
            for split in ("dev", "test") if split in results]
