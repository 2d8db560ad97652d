"""Resuming reads only formats that cannot run code, and passes over damaged checkpoints."""
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch

from bertforge.errors import BertforgeError
from bertforge.train.checkpointing import (TRAINER_TENSORS, latest_checkpoint, list_checkpoints,
                                           load_trainer_state, save_trainer_state)
from bertforge.train.config import TrainConfig
from bertforge.train.loop import train
from bertforge.train.optim import build_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from tiny_training import random_batches, tiny_classifier  # noqa: E402


def config_for(tmp_path, max_steps):
    return TrainConfig(output_dir=str(tmp_path), max_steps=max_steps, learning_rate=1e-3, save_every=2,
                       keep_last=5, tensorboard=False, plot=False)


class Planted:
    """A pickle that runs a command when loaded: what a hostile run folder would hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_never_runs_on_resume(tmp_path):
    run = tmp_path / "run"
    planted = run / "step-000002"
    planted.mkdir(parents=True)
    tiny_classifier(dropout=0.0).save_pretrained(planted / "model")
    marker = tmp_path / "pwned"
    (planted / "trainer_state.pt").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(BertforgeError, match="old pickle format"):
        train(tiny_classifier(dropout=0.0), random_batches(), config_for(run, 4), resume=True)
    assert not marker.exists()


def test_trainer_state_round_trips_through_json_and_safetensors(tmp_path):
    model = tiny_classifier(dropout=0.0)
    optimizer = build_optimizer(model, 1e-3, 0.01)
    model(input_ids=torch.randint(5, 50, (2, 8)), labels=torch.tensor([0, 1])).loss.backward()
    optimizer.step()
    state = {"step": 7, "optimizer": optimizer.state_dict(), "data": {"epoch": 1, "batches_done": 3},
             "best": None, "betas": (0.9, 0.999), "inf": float("inf")}
    save_trainer_state(state, tmp_path)
    loaded = load_trainer_state(tmp_path)
    assert loaded["step"] == 7 and loaded["data"] == state["data"] and loaded["best"] is None
    assert loaded["betas"] == (0.9, 0.999) and loaded["inf"] == float("inf")
    assert loaded["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert set(loaded["optimizer"]["state"]) == set(state["optimizer"]["state"])  # integer keys kept
    for key, slots in state["optimizer"]["state"].items():
        for name, value in slots.items():
            torch.testing.assert_close(loaded["optimizer"]["state"][key][name], value, rtol=0, atol=0)


def test_resume_passes_over_a_truncated_newest_checkpoint(tmp_path):
    train(tiny_classifier(dropout=0.0), random_batches(), config_for(tmp_path / "whole", 6))
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "step-000006")  # killed after saving step 4 ...
    newest = latest_checkpoint(tmp_path / "cut")
    tensors = newest / TRAINER_TENSORS
    tensors.write_bytes(tensors.read_bytes()[:100])  # a save cut short (full disk)
    records = train(tiny_classifier(dropout=0.0), random_batches(), config_for(tmp_path / "cut", 6), resume=True)
    assert min(r["step"] for r in records) > 2  # continued from step 2, the newest good one
    whole = load_trainer_state(latest_checkpoint(tmp_path / "whole"))
    resumed = load_trainer_state(latest_checkpoint(tmp_path / "cut"))
    assert resumed["step"] == whole["step"] == 6
    for key, slots in whole["optimizer"]["state"].items():
        torch.testing.assert_close(resumed["optimizer"]["state"][key]["exp_avg"], slots["exp_avg"])
    assert [p.name for p in list_checkpoints(tmp_path / "cut")][-1] == "step-000006"
