"""Continuing a run (`--resume`): the newest good checkpoint, restored once the run's settings are checked against it.

Every checkpoint's trainer state records what the run is made of: `config` (the loop's TrainConfig) and
`inputs` (`run_inputs`: the recipe's other settings, its data files by size and modification time, its
starting checkpoint by its weights' fingerprint). What a checkpoint holds (AdamW's moments and learning
rates, the schedule's position, the data position) belongs to those settings, so a resume with other ones
is refused in one line naming what changed (`check_resumable`). Before, a changed learning rate was written
into the new checkpoints while the restored optimizer went on with the old one, and a run resumed on another
data file went on from the old file's position, silently.

What may change on resume (MAY_CHANGE_ON_RESUME, a setting of that name wherever it is in the recipe):
how far the run goes (max_steps, epochs, early_stopping_patience; an extended run stretches its schedule to
the new length, its first step resumed included, and max_steps may not fall below the checkpoint's step), when
it logs, evaluates and saves (log_every, eval_every, save_every, keep_last, eval_at_start, eval_batch_size,
eval_batches), where and how fast it runs (device, precision, compile, cuda_graphs, masked_only_head; the command
line's --threads is no setting), and output_dir, tensorboard, plot. Everything else shapes the run: the data
files, the model and task settings, the batch size, the optimiser and schedule (learning_rate, weight_decay,
warmup, schedule, grad_accumulation, max_grad_norm), the seed, the best-model metric and its direction
(greater_is_better, compared as the direction it judges by: `by_direction`).

`setting_changes` is also the rule by which pretraining checks its vocabulary and prepared-corpus caches.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file

from ..errors import BertforgeError
from ..input_files import fingerprints
from ..models.folder import is_model_folder, model_fingerprint, read_model_folder
from ..models.weight_files import WEIGHTS_SAFETENSORS
from ..resources import resolve_model
from ..settings import PATH_KIND
from .checkpointing import latest_checkpoint, list_checkpoints, load_trainer_state
from .config import TrainConfig, higher_is_better
from .optim import rates_of_schedule

logger = logging.getLogger("bertforge")

MAY_CHANGE_ON_RESUME = frozenset({
    "max_steps", "epochs", "early_stopping_patience",  # how far: the schedule stretches to the new length
    "log_every", "eval_every", "save_every", "keep_last", "eval_at_start", "eval_batch_size", "eval_batches",
    "device", "precision", "compile", "cuda_graphs", "masked_only_head",  # where and how fast, not what
    "output_dir", "tensorboard", "plot",
})
START_OVER = "or start over: run without --resume into a new output folder, or with --overwrite"
FINGERPRINT = "sha256:"  # the start of a checkpoint's identity in `inputs`: its weights' fingerprint


def run_inputs(recipe=None, init_from: str | None = None) -> dict[str, Any]:
    """What a run is made of besides its TrainConfig, by dotted key: every setting of `recipe` (a recipe
    dataclass; its TrainConfig section is left to the loop's `config`), a file or folder setting as its files'
    fingerprints (`input_files.fingerprints`), a checkpoint setting and `init_from` as its weights'."""
    inputs = settings_of(recipe) if recipe is not None else {}
    if init_from and "init_from" not in inputs:
        inputs["init_from"] = checkpoint_identity(init_from)
    return inputs


def settings_of(section, prefix: str = "") -> dict[str, Any]:
    values = {}
    for field in dataclasses.fields(section):
        value, key, kind = getattr(section, field.name), prefix + field.name, field.metadata.get(PATH_KIND)
        if isinstance(value, TrainConfig):
            continue
        if dataclasses.is_dataclass(value):
            values.update(settings_of(value, key + "."))
        elif kind == "checkpoint":
            values[key] = checkpoint_identity(value)
        elif kind:
            values[key] = file_fingerprints(value)
        else:
            values[key] = json.loads(json.dumps(value, default=str))  # as the trainer state reads it back
    return values


def checkpoint_identity(name: str | None) -> str | None:
    """A checkpoint (folder or packaged short name) by its weights' fingerprint, so the same model spelt
    another way is the same and one retrained in place is not; anything else (a hub id, a vocab.txt) as given."""
    try:
        folder = Path(resolve_model(name)) if name else None
    except ValueError:  # a packaged name whose package is missing: loading it says so
        return name
    if folder is None or not folder.is_dir():
        return name
    if is_model_folder(folder):  # else a vocabulary folder: its files are the identity
        folder = read_model_folder(folder).transformer
    return FINGERPRINT + model_fingerprint(folder)


def file_fingerprints(paths: str | list[str] | None) -> list[dict]:
    """Fingerprints of the files of a path setting (a folder: every file in it that is not hidden); paths that
    do not exist are left out (reading them fails first)."""
    files = []
    given = [paths] if isinstance(paths, str) else paths or []
    for path in map(Path, filter(None, given)):  # "" is a setting left unset (no dev file), not the working folder
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()
                                and not any(part.startswith(".") for part in p.relative_to(path).parts)))
        elif path.is_file():
            files.append(path)
    return fingerprints(files)


def setting_changes(recorded: dict, now: dict, prefix: str = "", may_change=frozenset()) -> list[str]:
    """What differs between two records of settings, a phrase per setting, e.g. "training.learning_rate 2e-05
    -> 0.5". Only keys both records hold count (one an older bertforge did not record cannot be checked), and
    none whose last name is in `may_change`."""
    return [describe(prefix + key, recorded[key], value) for key, value in now.items()
            if key in recorded and key.rsplit(".", 1)[-1] not in may_change and recorded[key] != value]


def describe(key: str, before: Any, after: Any) -> str:
    if isinstance(before, list) and isinstance(after, list) and all(isinstance(r, dict) for r in before + after):
        return f"{key}: {files_change(before, after)}"
    if isinstance(before, str) and isinstance(after, str) and FINGERPRINT in before + after:
        return f"{key}: another checkpoint, or its weights or vocabulary changed"
    return f"{key} {short(before)} -> {short(after)}"


def files_change(before: list[dict], after: list[dict]) -> str:
    """How two lists of file fingerprints differ: files added or removed, or the first file changed."""
    old, new = [r["path"] for r in before], [r["path"] for r in after]
    if old != new:
        added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        parts = ([f"now {', '.join(added)}"] if added else []) + ([f"was {', '.join(removed)}"] if removed else [])
        return "; ".join(parts) or "the files are listed in another order"
    changed = next(b for a, b in zip(before, after) if a != b)
    return f"{changed['path']} changed (its size or modification time)"


def short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def check_resumable(state: dict, config: TrainConfig, inputs: dict | None, checkpoint: Path) -> None:
    """Raise BertforgeError, one line naming what changed, unless `config` and `inputs` (None: not recorded by
    this caller) are those the checkpoint's run was made with, but for MAY_CHANGE_ON_RESUME."""
    now, recorded = json.loads(json.dumps(asdict(config))), state.get("config") or {}
    changes = setting_changes(by_direction(recorded), by_direction(now), "training.", MAY_CHANGE_ON_RESUME)
    old_default = recorded.get("greater_is_better") is True and config.greater_is_better is None
    changes = [change + (INFERRED_DIRECTION.format(config.best_metric) if old_default and change.startswith(DIRECTION)
                         else "") for change in changes]
    if inputs is not None and state.get("inputs") is not None:
        changes += setting_changes(state["inputs"], inputs, "", MAY_CHANGE_ON_RESUME)
    elif inputs:
        logger.warning("%s does not record its data and recipe settings (an older bertforge); they are not checked",
                       checkpoint)
    if state["step"] > config.max_steps:
        changes.append(f"training.max_steps {config.max_steps} is below the checkpoint's step {state['step']}")
    if changes:
        more = f" (and {len(changes) - 3} more)" if len(changes) > 3 else ""
        raise BertforgeError(f"cannot resume from {checkpoint}: {'; '.join(changes[:3])}{more} since the run "
                             f"started; its checkpoints belong to the settings it started with: set them back, "
                             f"{START_OVER}")


DIRECTION = "training.greater_is_better "
INFERRED_DIRECTION = (" (left unset, it now follows best_metric's name: lower is better for {!r}; the run started "
                      "when unset meant true: set training.greater_is_better true to go on as it started)")


def by_direction(settings: dict) -> dict:
    """A TrainConfig's record with greater_is_better as the direction best_metric is judged by (`higher_is_better`),
    and without it when there is no best_metric (it judges nothing then). Its default was true before it became
    unset (inferred from the metric's name): a run started with true for 'accuracy' resumes with it unset."""
    settled = {key: value for key, value in settings.items() if key != "greater_is_better"}
    if settings.get("best_metric") and "greater_is_better" in settings:
        settled["greater_is_better"] = higher_is_better(settings["best_metric"], settings["greater_is_better"])
    return settled


def follow_this_runs_schedule(scheduler, state: dict, config: TrainConfig | None) -> None:
    """The next step's learning rate by this run's schedule (`optim.rates_of_schedule`), where the restored optimizer
    holds the checkpoint's. They differ where the run was extended on resume, or where the steps of a fractional
    warm-up or of epochs come out otherwise (an older bertforge rounded them down; now up, as transformers' Trainer):
    said in a warning, since the run then goes on by a schedule other than the one it started with."""
    restored = scheduler.optimizer.param_groups[0]["lr"]
    rates_of_schedule(scheduler)
    now = scheduler.optimizer.param_groups[0]["lr"]
    if now != restored:
        recorded = (state.get("config") or {}).get("max_steps", "?")
        logger.warning("step %d runs at learning rate %.3g by this run's schedule (max_steps %s; the checkpoint's run "
                       "had %s), where the checkpoint's schedule gave %.3g", state["step"] + 1, now,
                       config.max_steps if config else "?", recorded, restored)


def resume_from_newest_good(run_dir: Path, model, optimizer, scheduler, batches, device, best, topology,
                            config: TrainConfig, inputs: dict | None = None) -> int:
    """Restore the newest checkpoint that loads whole, passing over damaged ones; returns its step (0: none).

    Raises BertforgeError when that checkpoint's run had other settings (`check_resumable`)."""
    latest_checkpoint(run_dir)  # raises on a folder of old pickled checkpoints, which are never loaded
    for checkpoint in reversed(list_checkpoints(run_dir)):
        try:
            step = restore(checkpoint, model, optimizer, scheduler, batches, device, best, config, inputs)
        except (ValueError, SafetensorError) as error:
            logger.warning("passing over a damaged checkpoint: %s", error)
            continue
        if topology.is_main:
            logger.warning("resumed from %s at step %d", checkpoint, step)
        return step
    if topology.is_main:
        logger.warning("nothing to resume in %s: no complete checkpoint; starting from step 0", run_dir)
    return 0


def restore(checkpoint: Path, model, optimizer, scheduler, batches, device, best=None,
            config: TrainConfig | None = None, inputs: dict | None = None) -> int:
    """Check the settings (with a `config`), then load weights, optimizer, schedule, data position (and
    best-model record); returns the step to continue from."""
    state = load_trainer_state(checkpoint)
    if config is not None:
        check_resumable(state, config, inputs, checkpoint)
    weights = load_file(str(checkpoint / "model" / WEIGHTS_SAFETENSORS), device=str(device))
    model.load_state_dict(weights, strict=False)  # tied weights are not stored; they follow their twin
    if state.get("training_only") is not None:
        model.load_training_only_state_dict(state["training_only"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    follow_this_runs_schedule(scheduler, state, config)
    batches.load_state_dict(state["data"])
    if best is not None and state.get("best"):
        best.load_state_dict(state["best"])
    return state["step"]
