"""The one training loop: pretraining and fine-tuning recipes both call `train`.

What a recipe supplies: the model (its forward returns `.loss`), a stream of batches
that can report and restore its position, a `statistics` function turning a batch and
its output into (sum, count) pairs (accuracies, ...), and optionally an `evaluate`
function. The loop owns the rest: AdamW + schedule, accumulation, clipping, bf16,
DDP, progress, logs, checkpoints, exact resume (refused when the run's settings changed:
resume.py), the NaN guard, and (with best_metric) the best model by evaluation and early stopping.

It keeps a GPU fed: batches are made (and packed, and pinned) ahead of the step in a
background thread; statistics and losses stay on the device and are read back only every
log_every steps (and before an evaluation or a checkpoint), so the host never waits for
the device in between; AdamW is the fused kernel on CUDA; bf16 is the default there.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch
from tqdm.auto import tqdm

from ..engine.devices import cpu_has_amx, to_device
from ..validation import STEPS_TO_RUN, check_bound
from .best import BestModel, best_model_folder
from .checkpointing import save_checkpoint
from .config import TrainConfig, higher_is_better
from .cuda_graph_step import GraphedStep, graphs_apply
from .distributed import Topology, all_reduce_sum, average_gradients, barrier, broadcast_parameters
from .interrupt import StopRequests
from .memory import TRIM_EVERY, release_freed_memory
from .optim import build_optimizer, clip_gradients, learning_rate_schedule, warmup_steps_from
from .prefetch import Prefetcher
from .resume import resume_from_newest_good
from .running_metrics import RunningMetrics, Statistics, fmt
from .run_log import RunLog, plot_curves

class BatchStream(Protocol):
    """Endless batches (epoch after epoch) whose position can be saved and restored.

    A stream may also tell where its epochs end, `batches_left_in_epoch(position) -> int` (ShuffledBatches does):
    an optimizer step then takes its grad_accumulation micro-batches only up to an epoch's last batch, so a run
    counted in epochs passes over its data exactly that many times. A stream without it (pretraining's, counted in
    steps) fills every step.
    """

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def train(model: torch.nn.Module, batches: BatchStream, config: TrainConfig, *, statistics: Statistics | None = None,
          evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None, tokenizer=None,
          topology: Topology = Topology(), device: torch.device = torch.device("cpu"),
          resume: bool = False, forward_kwargs: dict[str, Any] | None = None,
          inputs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run (or continue) training to config.max_steps; returns the logged records.

    forward_kwargs go to every forward call (masked_only=True: the fast MLM head). With config.best_metric the best
    model so far is kept in output_dir/best (HF format, with the tokenizer) and training stops after
    early_stopping_patience evaluations without a new best. inputs (`resume.run_inputs`) are recorded with config.
    Raises TrainingDiverged when the loss stops being finite, BertforgeError when resumed with them changed.
    """
    check_bound(STEPS_TO_RUN, "max_steps", config.max_steps, "training.")
    run_dir = Path(config.output_dir)
    model.to(device)
    optimizer, scheduler = optimizer_and_schedule(model, config, device)
    best = best_model_tracker(config)
    step = 0 if not resume else resume_from_newest_good(run_dir, model, optimizer, scheduler, batches, device, best,
                                                        topology, config, inputs)
    forward_model = wrap_for_training(model, config, topology, device)
    log = RunLog(run_dir, resume_step=step, tensorboard=config.tensorboard) if topology.is_main else None
    progress = tqdm(total=config.max_steps, initial=step, desc="train", disable=not topology.is_main, dynamic_ncols=True)
    stop = steps = None  # a Ctrl-C before the first step closes the bar too, so "interrupted" gets its own line
    try:
        if evaluate is not None and step == 0 and config.eval_at_start:
            run_evaluation(model, evaluate, 0, log, progress, topology)
        running = RunningMetrics(device, first_step=step + 1)
        steps = StepRunner.build(model, forward_model, optimizer, scheduler, batches, config, topology, device,
                                 running, statistics, forward_kwargs or {})
        model.train()
        compiled_at = step + 1 if config.compile and topology.is_main else None  # the step that pays for compiling
        stop = StopRequests().install()  # Ctrl-C / SIGTERM: finish the step, save, then stop (train/interrupt.py)
        while step < config.max_steps and not (best and best.should_stop):
            started = time.perf_counter()
            # Dropout noise is a function of (seed, rank, step): a resumed run draws what the original would have.
            torch.manual_seed(config.seed * 1_000_003 + topology.rank * 7_919 + step)
            steps.step()
            step += 1
            progress.update(1)
            tidy_after_step(step, compiled_at, started, progress)
            due = due_at(step, config, stop.requested(topology), evaluate is not None, device)
            if due.reading:
                running.raise_if_diverged(topology, run_dir)  # reading the losses waits for the device
            if due.logging:
                log_step(step, scheduler.get_last_lr()[0], running.summary(topology, steps.stream), progress, log)
            end = due.end
            if due.evaluating:
                scores = run_evaluation(model, evaluate, step, log, progress, topology)
                end = (best is not None and keep_if_best(best, scores, step, model, run_dir, tokenizer, progress,
                                                         topology)) or end  # keep_if_best first: it always runs
            if due.saving or end:  # end: early stopping decided by this evaluation
                save_training_state(run_dir, step, model, optimizer, scheduler, steps.stream, config, inputs, best,
                                    tokenizer, topology)
            if due.stopping:
                raise stop.interrupted(step, run_dir)
    finally:
        close_run(stop, steps and steps.stream, progress, log)
    stop.raise_if_requested(step, run_dir, topology)  # asked during the last step's evaluation or save
    model.eval()
    return finished_records(log, run_dir, config.plot)


@dataclass
class StepRunner:
    """What an optimizer step works with; `step` replays it from a CUDA graph where one applies and takes the
    batch (cuda_graph_step.py), else runs it eagerly: forward and backward over the micro-batches, then AdamW."""
    model: torch.nn.Module
    forward_model: torch.nn.Module  # the model as wrapped for training: DDP, torch.compile
    optimizer: torch.optim.Optimizer
    scheduler: Any
    config: TrainConfig
    topology: Topology
    device: torch.device
    autocast: Any
    running: RunningMetrics
    statistics: Statistics | None
    forward_kwargs: dict
    stream: Prefetcher
    graphed: GraphedStep | None
    batches_left_in_epoch: Callable[[Any], int] | None  # the stream's (BatchStream); None: it has no epoch ends

    @classmethod
    def build(cls, model, forward_model, optimizer, scheduler, batches: BatchStream, config: TrainConfig,
              topology: Topology, device: torch.device, running: RunningMetrics, statistics: Statistics | None,
              forward_kwargs: dict) -> "StepRunner":
        bf16 = precision_of(config, device, model) == "bf16"
        graphed = None
        if graphs_apply(config, device, topology) and getattr(batches, "one_shape", False):
            graphed = GraphedStep(model, optimizer, config.max_grad_norm, bf16, forward_kwargs)
        stream = Prefetcher.for_model(batches, model, device, pack=graphed is None)  # a graph takes one shape
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
        return cls(model, forward_model, optimizer, scheduler, config, topology, device, autocast, running,
                   statistics, forward_kwargs, stream, graphed, getattr(batches, "batches_left_in_epoch", None))

    def micro_batches(self) -> int:
        """The next step's micro-batches: grad_accumulation, fewer where the epoch ends sooner (its last step). Read
        from the position of the last batch the loop took, so a resumed run cuts its steps where the original did."""
        if self.batches_left_in_epoch is None:
            return self.config.grad_accumulation
        return min(self.config.grad_accumulation, self.batches_left_in_epoch(self.stream.state_dict()))

    def step(self) -> None:
        if self.graphed is None:
            self.eager_step(self.stream.next_batch, self.micro_batches())
            return
        batch = to_device(self.stream.next_batch(), self.device)
        output = self.graphed.run(batch)
        if output is None:  # warm-up, or a batch of another shape
            self.optimizer.zero_grad(set_to_none=True)  # after the capture the gradients are the graph's
            self.eager_step(lambda: batch, 1)  # a graph only at grad_accumulation 1 (graphs_apply): never a short step
            return
        self.running.add(self.graphed.inputs, output, self.statistics)  # before the next replay overwrites them
        self.running.end_step()
        self.scheduler.step()

    def eager_step(self, next_batch: Callable[[], dict], micro_batches: int) -> None:
        accumulate_gradients(self.forward_model, next_batch, micro_batches, self.topology, self.device, self.autocast,
                             self.running, self.statistics, self.forward_kwargs)
        optimizer_step(self.model, self.optimizer, self.scheduler, self.config.max_grad_norm)


@dataclass(frozen=True)
class Due:
    """What is due after a step: each a bool (see `due_at`)."""
    end: bool  # the last step
    stopping: bool  # Ctrl-C / SIGTERM: save, then stop
    evaluating: bool
    saving: bool
    logging: bool
    reading: bool  # read the losses back (they wait for the device) to catch a divergence


def due_at(step: int, config: TrainConfig, stop_requested: bool, can_evaluate: bool, device: torch.device) -> Due:
    end = step == config.max_steps
    # A request at the last step still stops the process once the end is saved: the caller (a recipe's scoring, the
    # next stage, adapt's timing of a step) would otherwise carry on as if Ctrl-C had never been pressed.
    stopping = stop_requested
    evaluating = can_evaluate and (end or bool(config.eval_every and step % config.eval_every == 0))
    saving = end or stopping or bool(config.save_every and step % config.save_every == 0)
    logging = step % config.log_every == 0
    # On the CPU every step: nothing runs ahead to lose by reading.
    reading = logging or evaluating or saving or device.type == "cpu"
    return Due(end, stopping, evaluating, saving, logging or end, reading)


def best_model_tracker(config: TrainConfig) -> BestModel | None:
    """The tracker of config.best_metric; None without one: the last model is the one that ships."""
    if not config.best_metric:
        return None
    greater_is_better = higher_is_better(config.best_metric, config.greater_is_better)  # unset: by the name
    return BestModel(config.best_metric, greater_is_better, config.early_stopping_patience)


def tidy_after_step(step: int, compiled_at: int | None, started: float, progress) -> None:
    """Say what compiling cost (the first step of a compiled run), and hand freed memory back now and then."""
    if step == compiled_at:
        progress.write(f"torch.compile: the first step took {time.perf_counter() - started:.1f} s "
                       "(compiling; a new batch shape may compile again)")
    if step % TRIM_EVERY == 0:
        release_freed_memory()


def close_run(stop: StopRequests | None, stream: Prefetcher | None, progress, log: RunLog | None) -> None:
    """Give back what a run holds, finished or not: signal handlers, the prefetch thread, the bar, the log (None:
    not taken yet)."""
    if stop is not None:
        stop.uninstall()
    if stream is not None:
        stream.close()
    progress.close()
    if log:
        log.close()


def optimizer_and_schedule(model: torch.nn.Module, config: TrainConfig, device: torch.device):
    """AdamW (fused on CUDA) and its learning-rate schedule with warm-up, over config.max_steps."""
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay, fused=device.type == "cuda")
    warmup = warmup_steps_from(config.warmup, config.max_steps)
    return optimizer, learning_rate_schedule(optimizer, config.schedule, warmup, config.max_steps)


def optimizer_step(model: torch.nn.Module, optimizer, scheduler, max_grad_norm: float) -> None:
    """Clip the gradients (max_grad_norm 0: not), step the optimizer and the schedule, and drop the gradients."""
    clip_gradients(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def log_step(step: int, learning_rate: float, means: dict[str, float], progress, log: RunLog | None) -> None:
    """The means since the last log line on the progress bar and (rank 0) into the run log."""
    record = {"step": step, "lr": learning_rate, **means}
    progress.set_postfix({k: fmt(v) for k, v in record.items() if k not in ("step", "lr")}, refresh=False)
    if log:
        log.write(record)


def save_training_state(run_dir: Path, step: int, model, optimizer, scheduler, stream: Prefetcher,
                        config: TrainConfig, inputs: dict | None, best: BestModel | None, tokenizer,
                        topology: Topology) -> None:
    """Rank 0 writes the checkpoint (weights, optimizer, schedule, data position, best-model record, and the
    settings a resume is checked against); every rank waits for it, so none runs ahead of a save it may resume from."""
    if topology.is_main:
        state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "data": stream.state_dict(), "config": asdict(config), "inputs": inputs,
                 "best": best.state_dict() if best else None, "training_only": training_only_weights(model)}
        save_checkpoint(run_dir, step, model, state, config.keep_last, tokenizer=tokenizer)
    barrier(topology)


def training_only_weights(model) -> dict[str, torch.Tensor] | None:
    """Weights a model trains but does not save in its folder (TSDAE's decoder), from its
    `training_only_state_dict()`: the checkpoint keeps them with the optimizer's state, and a resume
    gives them back through `load_training_only_state_dict`. None for a model without any."""
    own = getattr(model, "training_only_state_dict", None)
    return own() if own is not None else None


def finished_records(log: RunLog | None, run_dir: Path, plot: bool) -> list[dict[str, Any]]:
    """The logged records (rank 0; [] on the others), with the curves plotted when asked."""
    if log is None:
        return []
    if plot:
        plot_curves(log.path, run_dir / "curves.png")
    return log.records()


def precision_of(config: TrainConfig, device: torch.device, model: torch.nn.Module | None = None) -> str:
    """config.precision with `auto` resolved. On a GPU with bf16 (every one since Ampere): bf16 autocast for models
    of BERT-base width and up, fp32 below it, where a step is host-bound and autocast's casts are more launches (H200,
    2026-11-26: `adapt --preset full`'s MiniLM ICT stage 14 s in fp32 against 33 s in bf16; BERT-base pretraining
    steps 0.035 s in bf16 against 0.052). On a CPU with AMX (bf16 matrix units): bf16 (a 2-core Xeon's MiniLM step of
    32 x 160 tokens took 1.3 s against 2.0 in fp32). Else fp32: without AMX, bf16 on the CPU is emulated and slower."""
    if config.precision != "auto":
        return config.precision
    if device.type == "cuda":
        width = hidden_width(model) if model is not None else None
        wide_enough = width is None or width >= BF16_PAYS_FROM_WIDTH_ON_GPU
        return "bf16" if wide_enough and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_amx() else "fp32"


BF16_PAYS_FROM_WIDTH_ON_GPU = 768  # BERT-base; at 512 (BERT-medium) bf16 steps were still slower on an H200


def hidden_width(model: torch.nn.Module) -> int | None:
    """The hidden size in the config of the model or of the BERT it wraps (a head's or an encoder's `bert`)."""
    for candidate in (model, getattr(model, "bert", None)):
        width = getattr(getattr(candidate, "config", None), "hidden_size", None)
        if isinstance(width, int):
            return width
    return None


def accumulate_gradients(forward_model, next_batch: Callable[[], dict], micro_batches: int, topology: Topology,
                         device: torch.device, autocast, running: RunningMetrics, statistics: Statistics | None,
                         forward_kwargs: dict) -> None:
    """Forward and backward over the step's micro_batches (StepRunner.micro_batches), the gradient their mean loss's;
    DDP all-reduces on the last one only."""
    by_hand = topology.distributed and syncs_by_hand(forward_model)
    for micro_step in range(micro_batches):
        batch = to_device(next_batch(), device)
        last = micro_step == micro_batches - 1
        sync = contextlib.nullcontext() if last or not topology.distributed or by_hand else forward_model.no_sync()
        with sync:
            with autocast:
                output = forward_model(**batch, **forward_kwargs)
            # By the micro-batches this step takes, not grad_accumulation: an epoch's short last step is a mean too.
            (output.loss / micro_batches).backward()
        running.add(batch, output, statistics)
    if by_hand:
        average_gradients(forward_model, topology)
    running.end_step()


def syncs_by_hand(model: torch.nn.Module) -> bool:
    """Whether the model's backward is several passes (`several_backward_passes`: the gradient cache's), which
    DistributedDataParallel's hooks refuse (a parameter marked ready twice in one step): the loop then averages
    the gradients over the ranks itself after the step's backward passes."""
    return getattr(model, "several_backward_passes", False)


def run_evaluation(model, evaluate, step: int, log: RunLog | None, progress, topology: Topology) -> dict[str, float]:
    """Evaluate on rank 0 (held-out data is small), log it, and hold the other ranks until it is done.

    Returns the scores (under evaluate()'s own names) on rank 0, {} on the others.
    """
    scores = {}
    if topology.is_main:
        model.eval()
        with torch.no_grad():
            scores = evaluate(model)
        model.train()
        log.write({"step": step, **{f"eval_{k}": v for k, v in scores.items()}})
        progress.write(f"step {step}: " + ", ".join(f"eval_{k} {fmt(v)}" for k, v in scores.items()))
    barrier(topology)
    return scores


def keep_if_best(best: BestModel, scores: dict[str, float], step: int, model, run_dir: Path, tokenizer, progress,
                 topology: Topology) -> bool:
    """Rank 0 judges and saves; every rank learns whether to stop (so all leave the loop together): returned."""
    verdict = torch.zeros(2)
    if topology.is_main:
        if best.update(scores, step):
            model.save_pretrained(best_model_folder(run_dir), tokenizer=tokenizer)
            progress.write(f"step {step}: new best {best.metric} {fmt(best.value)} saved to {best_model_folder(run_dir)}")
        verdict = torch.tensor([float(best.step or 0), float(best.evaluations_since_best)])
    verdict = all_reduce_sum(verdict, topology)  # only rank 0 contributes non-zeros
    best.step, best.evaluations_since_best = int(verdict[0]), int(verdict[1])
    if best.should_stop and topology.is_main:
        progress.write(f"step {step}: no new best {best.metric} in {best.patience} evaluations; stopping early "
                       f"(best {fmt(best.value)} at step {best.step})")
    return best.should_stop


def wrap_for_training(model: torch.nn.Module, config: TrainConfig, topology: Topology, device: torch.device):
    forward_model = model
    if topology.distributed and syncs_by_hand(model):
        broadcast_parameters(model, topology)  # accumulate_gradients averages the gradients itself
    elif topology.distributed:
        forward_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        forward_model = torch.compile(forward_model)
    return forward_model

