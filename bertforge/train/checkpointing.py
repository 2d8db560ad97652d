"""Training checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a folder `step-000123/` holding the model in HF format (so any
checkpoint is also a usable model) and `trainer_state.pt` with the optimizer,
scheduler, RNG states and data position. Folders appear whole (temp + rename),
and only the last K are kept.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..atomic import staging_folder

TRAINER_STATE = "trainer_state.pt"
STEP_PATTERN = re.compile(r"^step-(\d+)$")


def rng_states() -> dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, trainer_state: dict[str, Any], keep_last: int,
                    tokenizer=None) -> Path:
    """Write `run_dir/step-N` atomically, then drop all but the newest `keep_last` checkpoints."""
    target = run_dir / f"step-{step:06d}"
    with staging_folder(target) as staging:
        model.save_pretrained(staging / "model", tokenizer=tokenizer)
        torch.save(trainer_state, staging / TRAINER_STATE)
        if target.exists():  # re-saving a step (e.g. the final one) replaces it whole
            shutil.rmtree(target)
        staging.rename(target)
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return target


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a crash mid-write leaves only a hidden temp folder)."""
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if STEP_PATTERN.match(p.name) and (p / TRAINER_STATE).exists()]
    return sorted(found, key=lambda p: int(STEP_PATTERN.match(p.name).group(1)))


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    # weights_only=False: the state holds Python RNG tuples and numpy arrays we wrote ourselves.
    return torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=False)
