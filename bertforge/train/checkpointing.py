"""Training checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a folder `step-000123/` holding the model in HF format (so any
checkpoint is also a usable model) and the trainer state (optimizer, schedule, data
position, best-model record) as `trainer_state.json` plus `trainer_state.safetensors`
for its tensors. Neither format can run code when read, so a run folder from someone
else is safe to `--resume` (a pickle, which torch.load of a .pt file reads, is not).
Folders appear whole (`atomic.published_folder`), and only the last K are kept.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..atomic import published_folder
from ..errors import BertforgeError

logger = logging.getLogger("bertforge")

TRAINER_STATE = "trainer_state.json"
TRAINER_TENSORS = "trainer_state.safetensors"
PICKLED_STATE = "trainer_state.pt"  # what bertforge 0.1 wrote; never loaded
STEP_PATTERN = re.compile(r"^step-(\d+)$")


def save_checkpoint(run_dir: Path, step: int, model, trainer_state: dict[str, Any], keep_last: int,
                    tokenizer=None) -> Path:
    """Write `run_dir/step-N` atomically, then drop all but the newest `keep_last` checkpoints."""
    target = checkpoint_folder(run_dir, step)
    with published_folder(target, existing="replace") as staging:  # re-saving a step (the final one) replaces it whole
        model.save_pretrained(staging / "model", tokenizer=tokenizer)
        save_trainer_state(trainer_state, staging)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return target


def checkpoint_folder(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"step-{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a crash mid-write leaves only a hidden temp folder)."""
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if STEP_PATTERN.match(p.name) and (p / TRAINER_STATE).exists()]
    return sorted(found, key=lambda p: int(STEP_PATTERN.match(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints and any(run_dir.glob(f"step-*/{PICKLED_STATE}")):
        raise BertforgeError(
            f"{run_dir} holds only checkpoints in the old pickle format ({PICKLED_STATE}), which can run code "
            f"when loaded and so is not read; start the run again in a new output folder"
        )
    return checkpoints[-1] if checkpoints else None


def save_trainer_state(state: dict[str, Any], folder: Path) -> None:
    """`state` (nested dicts/lists/tuples of numbers, strings and tensors) -> JSON + safetensors in `folder`."""
    tensors: dict[str, torch.Tensor] = {}
    document = encode(state, tensors)
    save_file(tensors, str(folder / TRAINER_TENSORS))
    (folder / TRAINER_STATE).write_text(json.dumps(document), encoding="utf-8")


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The state `save_trainer_state` wrote (tensors on the CPU); raises ValueError if the files are damaged."""
    try:
        document = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))
        tensors = load_file(str(checkpoint / TRAINER_TENSORS))
        return decode(document, tensors)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as error:  # truncated, edited, missing
        raise ValueError(f"{checkpoint} is damaged ({type(error).__name__}: {error})") from error


# JSON has no tensors, tuples or non-string keys; these one-key objects stand for them.
TENSOR, TUPLE, ITEMS = "__tensor__", "__tuple__", "__items__"


def encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous()
        return {TENSOR: key}
    if isinstance(value, tuple):
        return {TUPLE: [encode(item, tensors) for item in value]}
    if isinstance(value, list):
        return [encode(item, tensors) for item in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value) and not {TENSOR, TUPLE, ITEMS} & set(value):
            return {key: encode(item, tensors) for key, item in value.items()}
        return {ITEMS: [[encode(key, tensors), encode(item, tensors)] for key, item in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"trainer state holds a {type(value).__name__}, which checkpoints cannot store")


def decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [decode(item, tensors) for item in value]
    if isinstance(value, dict):
        if set(value) == {TENSOR}:
            return tensors[value[TENSOR]]
        if set(value) == {TUPLE}:
            return tuple(decode(item, tensors) for item in value[TUPLE])
        if set(value) == {ITEMS}:
            return {decode(key, tensors): decode(item, tensors) for key, item in value[ITEMS]}
        return {key: decode(item, tensors) for key, item in value.items()}
    return value
