"""adapt's time budget: how many training steps fit in what is left of the run's minutes.

Before a training stage, `training_seconds` (the pipeline) takes what has run and what is still to come, priced at
what the base's scoring measured, from the budget; `budgeted_stage_steps` (a sentence-encoder stage) and
`budgeted_steps` (continued MLM, which gets MLM_SHARE of it) time a training step here with the one loop on a copy
of the model and train fewer steps when the preset's would not fit. The choice is kept in the stage's folder
(BUDGET_FILE), so a resumed stage trains the same schedule.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..atomic import write_text
from ..errors import TrainingInterrupted
from ..train.distributed import all_reduce_sum, barrier
from ..train.loop import train
from .stages import base_system

if TYPE_CHECKING:
    from ..tasks.retrieval.bi_encoder import BiEncoder
    from ..train.batches import ShuffledBatches
    from ..train.distributed import Topology
    from ..train.runner import RecipeRun
    from .methods import MethodSettings  # methods and pipeline import this module
    from .pipeline import Run

# The whole run's time, in minutes, that the training stages are sized to fit (--minutes; None: no budget). quick:
# the 20 minutes for a ~150k-word corpus on 2 CPU cores. On a faster machine the corpus rule
# (presets.QUICK_PASSAGES) is the shorter; on a slower one (an AVX2 CPU without AMX), the budget.
MINUTES = {"quick": 20.0, "full": None}
BUDGET_MARGIN_SECONDS = 30.0  # writing the model, the report and the index's files, and what estimates miss
BUDGET_FILE = "budget.json"  # in the stage's run folder: the length a time budget chose, kept for a resumed run
TIMED_STEPS = 3  # steps of the one loop, on a copy of the model, that time a step on this machine (after one)
MIN_BUDGET_STEPS = 10  # a budget too short for even these still trains them: a handful of steps changes nothing
# The steps planned fill this share of the seconds left: a step's time varies with its batch's lengths, and the
# timed ones are few (Python's FAQ, 2 threads: timed 3.9 s a step in bf16 where the stage averaged ~4.6; 7.2 s in
# fp32 on the AVX2 stand-in, where it averaged ~7.1)
BUDGET_SHARE = 0.85
# Continued MLM (a base with an MLM head: the BioBERT / ClinicalBERT recipe) gets at most this share of the training
# time; the sentence-encoder stages after it, which are what makes the search better, get the rest. Without it a
# BERT-base's epoch of a ~150k-word corpus (~47 steps of 32 x 128 tokens at ~7 s in bf16 on this 2-core Xeon, ~14 s
# in fp32) took the whole budget on a slower CPU and left ICT its minimum. (47 steps was the old sizing, half a real
# epoch; a real one, counted from the prepared corpus, is ~77 on Emma's 157k words: the share matters more now.)
MLM_SHARE = 1 / 3


def budget_minutes(preset: str, minutes: float | None) -> float | None:
    """The run's time budget in minutes: --minutes when given, else the preset's (MINUTES)."""
    return minutes if minutes is not None else MINUTES[preset]


@dataclasses.dataclass(frozen=True)
class StageTime:
    """What a training stage may take under the budget: `seconds` for its steps and its evaluations during training
    together, and `evaluation`, what one of those evaluations costs (the held-out ranking). `budgeted_stage_steps`
    charges the evaluations of the steps it chooses: a stage cut to less than an epoch evaluates once, at its end,
    and the seconds of the evaluations it no longer makes go to steps."""

    seconds: float
    evaluation: float = 0.0
    index: float = 0.0  # what indexing every passage is expected to take (kept out of `seconds`), to say so


def training_seconds(run: Run, systems: list[dict | None], settings: MethodSettings, started: float,
                     stages_left: int, more_scorings: int = 0) -> StageTime | None:
    """What the next stage's training (its steps and its evaluations during training) may take under the run's time
    budget (None: no budget).

    What is left of the budget after what has run, less what is still to come at the costs the base's scoring
    measured: the stage's final scoring (every set, every fusion weight), `more_scorings` more of those (a stage
    before it: continued MLM's encoder) and the index (every passage embedded), shared among the training stages
    left; with the cost of one evaluation during training. Rank 0 knows the costs; under torchrun every process
    gets the numbers, since all must train the same steps.
    """
    minutes = budget_minutes(run.options.preset, run.options.minutes)
    if minutes is None:
        return None
    left, evaluation, index = 0.0, 0.0, 0.0
    if run.topology.is_main:
        base = base_system(systems)
        scoring = base["seconds"]
        evaluation = base.get("held_out_seconds", scoring)  # a baseline cached before this was measured: the whole
        # the index embeds every passage, and their sentences (their share of the base's scoring, as measured)
        embedding = evaluation + base.get("sentence_seconds", 0.0)
        index = embedding * len(run.corpus.passages) / len(run.held_out.scored_indices())
        left = (minutes * 60 - (time.time() - started) - (1 + more_scorings) * scoring - index
                - BUDGET_MARGIN_SECONDS) / stages_left
    left, evaluation = all_reduce_sum(torch.tensor([left, evaluation], dtype=torch.float64), run.topology).tolist()
    return StageTime(left, evaluation, index)


def mlm_seconds(run: Run, systems: list[dict | None], first_stage: MethodSettings, started: float) -> float | None:
    """The seconds continued MLM's training steps may take (None: no budget): MLM_SHARE of what the training
    stages would have (`training_seconds`, with the MLM encoder's own scoring still to come, and the first stage's
    evaluations at the preset's length)."""
    time_left = training_seconds(run, systems, first_stage, started, stages_left=1, more_scorings=1)
    if time_left is None:
        return None
    evaluations = math.ceil(first_stage.epochs * first_stage.evaluations_per_epoch)
    return MLM_SHARE * (time_left.seconds - evaluations * time_left.evaluation)


def budgeted_stage_steps(run: RecipeRun, model: BiEncoder, fresh_batches: Callable, epochs: float, budget: StageTime,
                         evaluations_per_epoch: int = 1) -> int:
    """The steps a sentence-encoder stage trains (its max_steps): `epochs` of its batches as the recipe's schedule
    counts them (`epoch_steps`), or fewer when a step measured on this machine says they would not fit `budget`
    with the evaluations during training they make (`steps_within`).

    Steps are the one quantity: the budget charges its evaluations for these steps, the loop trains exactly them.
    (It chose epochs rounded to 2 decimals once, which the schedule turned back into steps: 12 steps that fit in
    epochs of 3,125 batches trained 1, and 1,236 of 1,000 trained 1,240, over the budget.)
    A step is timed on a copy of the model with the one loop (its precision, device, teacher and batches: what
    training will do; `timed_step_seconds`), in scratch folders; under torchrun the processes agree on their mean.
    At least MIN_BUDGET_STEPS steps. A resumed run reads the choice from run.folder/BUDGET_FILE (`kept_steps`).
    """
    batches = fresh_batches()
    per_epoch, most = batches.batches_per_epoch, epoch_steps(run, batches, epochs)
    kept = read_budget(run.folder)
    if run.resume and kept is not None:
        return kept_steps(kept, run, batches)
    trainee = copy.deepcopy(model)

    def train_steps(steps: int, scratch: Path) -> None:
        config = dataclasses.replace(run.training, output_dir=str(scratch), max_steps=steps, eval_every=0,
                                     save_every=0, best_metric="", tensorboard=False, plot=False, log_every=steps)
        train(trainee, fresh_batches(), config, device=run.device, topology=run.topology)

    step, seconds = timed_within(budget.seconds, train_steps, run.folder, run.topology)
    every = evaluation_interval(per_epoch, evaluations_per_epoch)
    steps = steps_within(seconds, step, budget.evaluation, every, most)
    if run.topology.is_main:
        # "epochs" is for reading (the report's stage record); "steps" is what a resumed stage trains
        write_text(run.folder / BUDGET_FILE, json.dumps({
            "steps": steps, "steps_without_budget": most, "epochs": round(steps / per_epoch, 4),
            "epochs_without_budget": epochs, "batches_per_epoch": per_epoch, "step_seconds": step,
            "seconds": seconds, "evaluation_seconds": budget.evaluation}) + "\n")
        fits = ("the preset's steps fit" if steps == most else
                f"{steps} steps ({steps / per_epoch:.3g} epochs) instead of the preset's {most} ({epochs:g})")
        print(f"time budget: {max(0.0, seconds):.0f} s left for training and its evaluations "
              f"({budget.evaluation:.0f} s each), {per_step(step)}: {fits}{index_note(budget, steps < most)}",
              flush=True)
    return steps


def index_note(budget: StageTime, cut: bool) -> str:
    """Why a stage was cut, when the index is most of it: a big corpus's index can take the whole budget (quick on
    /usr/share/doc's 10M words: 191,721 passages and their sentences to embed, far past the 20 minutes, and 10 steps
    trained)."""
    if not cut or budget.index <= max(budget.seconds, 0.0):
        return ""
    return (f"; indexing every passage is expected to take ~{budget.index / 60:.0f} min of the budget: "
            "--minutes above that gives training its time")


def epoch_steps(run: RecipeRun, batches: ShuffledBatches, epochs: float) -> int:
    """The steps `epochs` of `batches` train by the recipe's schedule (`train.optim.epoch_schedule`'s rule)."""
    return run.schedule(batches, epochs, has_dev=False, default_metric="").max_steps


def kept_steps(kept: dict, run: RecipeRun, batches: ShuffledBatches) -> int:
    """The steps a BUDGET_FILE says the stage trains. One written before steps were kept holds the epochs chosen,
    which that stage's schedule turned into steps by `epoch_steps`: a killed stage resumes with that schedule (a
    fraction of a step rounded up since 2026-11-28, as transformers' Trainer: one step more than it began with, at
    most, its rate from the stretched schedule: `train.optim.rates_of_schedule`)."""
    return kept["steps"] if "steps" in kept else epoch_steps(run, batches, kept["epochs"])


def steps_within(seconds: float, step_seconds: float | None, evaluation_seconds: float, every: int,
                 most: int) -> int:
    """The most steps, up to `most`, whose BUDGET_SHARE-padded time and the evaluations they make (one every
    `every` steps and one at the end) fit `seconds`; at least MIN_BUDGET_STEPS (`steps_that_fit`)."""
    steps = min(most, steps_that_fit(seconds, step_seconds))
    if step_seconds is None:
        return steps
    while steps > MIN_BUDGET_STEPS and steps * step_seconds / BUDGET_SHARE + evaluations(steps, every) * \
            evaluation_seconds > seconds:
        steps -= 1
    return steps


def evaluation_interval(batches_per_epoch: int, evaluations_per_epoch: int) -> int:
    """Steps between a stage's evaluations during training (methods.train_method evaluates and saves at it)."""
    return max(1, batches_per_epoch // evaluations_per_epoch)


def evaluations(steps: int, every: int) -> int:
    """Evaluations during a training run of `steps`: one every `every` steps, and one at the end (train.loop)."""
    return steps // every + (1 if steps % every else 0)


def budgeted_steps(folder: Path, steps: int, seconds: float, resume: bool, topology: Topology,
                   train_steps: Callable[[int, Path], None]) -> int:
    """`steps`, or fewer when a step timed here (`train_steps(n, scratch)` trains n steps with the one loop, in a
    scratch folder) says they would take more than `seconds`; at least MIN_BUDGET_STEPS. The choice is kept in
    folder/BUDGET_FILE, which a resumed run reads instead of timing again."""
    kept = read_budget(folder)
    if resume and kept is not None:
        return kept["steps"]
    step, seconds = timed_within(seconds, train_steps, folder, topology)
    chosen = min(steps, steps_that_fit(seconds, step))
    if topology.is_main:
        write_text(folder / BUDGET_FILE, json.dumps({"steps": chosen, "steps_without_budget": steps,
                                                     "step_seconds": step, "seconds": seconds}) + "\n")
        fits = "the preset's steps fit" if chosen == steps else f"{chosen} steps instead of the preset's {steps}"
        print(f"time budget: {max(0.0, seconds):.0f} s for continued MLM, {per_step(step)}: {fits}", flush=True)
    return chosen


def timed_within(seconds: float, train_steps: Callable[[int, Path], None], folder: Path, topology: Topology
                  ) -> tuple[float | None, float]:
    """(a step's seconds, what is left of `seconds` after timing it): the timing runs are part of the stage's time
    (6 steps and their setups: ~3 minutes for a BERT-base's ICT on 2 AVX2 cores). No time left: (None, seconds),
    untimed."""
    if seconds <= 0:
        return None, seconds
    started = time.perf_counter()
    step = timed_step_seconds(train_steps, folder, topology)
    # Under torchrun every process must plan the same steps: they take the mean of their timing's length too
    spent = all_reduce_sum(torch.tensor([time.perf_counter() - started], dtype=torch.float64), topology)
    return step, seconds - float(spent) / topology.world_size


def steps_that_fit(seconds: float, step_seconds: float | None) -> int:
    """Training steps of step_seconds that fill BUDGET_SHARE of `seconds`, at least MIN_BUDGET_STEPS (all there
    is when no step was timed: with no time left, timing one would only spend more; a BERT-base's ICT step takes
    ~30 s on 2 AVX2 cores and the timing runs 6)."""
    if step_seconds is None:
        return MIN_BUDGET_STEPS
    return max(MIN_BUDGET_STEPS, math.floor(BUDGET_SHARE * max(0.0, seconds) / step_seconds))


def per_step(step_seconds: float | None) -> str:
    return f"{step_seconds:.1f} s a step here" if step_seconds is not None else "no time left to time a step"


def read_budget(run_dir: Path) -> dict | None:
    """What `budgeted_stage_steps` or `budgeted_steps` chose for the stage trained in run_dir (None: no budget)."""
    path = run_dir / BUDGET_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def timed_step_seconds(train_steps: Callable[[int, Path], None], folder: Path, topology: Topology) -> float:
    """Seconds one training step takes here, steadily: `train_steps` run for 1 step and for 1 + TIMED_STEPS (each
    in a scratch folder inside `folder`, gone after), the difference over TIMED_STEPS, so what every run pays once
    (starting the loop, its first step's allocations, the final save) is left out."""
    def seconds_of(steps: int) -> float:
        # One scratch folder for every process under torchrun (rank 0 prepares data there that the others read)
        scratch = folder / f"timing-{steps}"
        if topology.is_main:
            shutil.rmtree(scratch, ignore_errors=True)  # a killed run's
            scratch.mkdir(parents=True)
        barrier(topology)
        started = time.perf_counter()
        try:
            train_steps(steps, scratch)
        except TrainingInterrupted:  # its checkpoint is in the scratch folder, about to go: say nothing of it
            shutil.rmtree(scratch, ignore_errors=True)
            raise TrainingInterrupted("interrupted while timing a training step for the time budget, before "
                                      "the stage trained") from None
        seconds = time.perf_counter() - started
        barrier(topology)  # every process is done with the scratch folder
        if topology.is_main:
            shutil.rmtree(scratch, ignore_errors=True)
        return seconds

    # 1 step is timed before and after the longer run: the first run in a process also pays for what the process
    # does once (thread pools, the kernels' first calls: ~0.8 s for a bert-tiny MLM run whose steps take 0.3 s)
    first, longer, last = seconds_of(1), seconds_of(1 + TIMED_STEPS), seconds_of(1)
    seconds = max(1e-3, (longer - min(first, last)) / TIMED_STEPS)
    # Every process must train the same number of steps: they take the mean of what each measured.
    mean = all_reduce_sum(torch.tensor([seconds], dtype=torch.float64), topology) / topology.world_size
    return float(mean)
