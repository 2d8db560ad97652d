"""What the loop logs: sums of loss, statistics and tokens kept on the device between log lines.

The loop (loop.py) adds every micro-batch here and reads values back only every log_every steps,
so the host does not wait for the device in between.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import TrainingDiverged
from .distributed import Topology, all_reduce_sum
from .prefetch import Prefetcher

# A recipe's statistics: (batch, model output) -> {name: (sum, count)}, e.g. accuracies.
Statistics = Callable[[dict, Any], dict[str, tuple[torch.Tensor, torch.Tensor]]]


class RunningMetrics:
    """Sums of loss, statistics and tokens since the last log line, kept on the device.

    Nothing here reads a value back until `raise_if_diverged` or `summary`, which the loop calls
    every log_every steps (and before evaluating or saving): reading waits for the device.
    """

    def __init__(self, device: torch.device, first_step: int = 1):
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.micro_losses: list[torch.Tensor] = []
        self.step_losses: list[torch.Tensor] = []  # one (sum over micro-batches, count) pair per step
        self.first_unchecked_step = first_step
        self.started = time.perf_counter()

    def as_device_float(self, value) -> torch.Tensor:
        return torch.as_tensor(value).detach().to(self.device, torch.float32, non_blocking=True)

    def add(self, batch: dict, output, statistics: Statistics | None) -> None:
        self.micro_losses.append(output.loss.detach().float())
        values = {"loss": (output.loss, 1.0)}
        if "attention_mask" in batch:
            values["tokens"] = (batch["attention_mask"].sum(), 0.0)
        if statistics is not None:
            values.update(statistics(batch, output))
        for key, (total, count) in values.items():
            pair = torch.stack([self.as_device_float(total), self.as_device_float(count)])
            self.sums[key] = self.sums[key] + pair if key in self.sums else pair

    def end_step(self) -> None:
        losses = torch.stack(self.micro_losses)
        self.step_losses.append(torch.stack([losses.sum(), self.as_device_float(len(losses))]))
        self.micro_losses = []

    def raise_if_diverged(self, topology: Topology, run_dir: Path) -> None:
        """Raise TrainingDiverged at the first step since the last check whose mean loss (over ranks) is not finite."""
        if not self.step_losses:
            return
        reduced = all_reduce_sum(torch.stack(self.step_losses), topology).cpu()  # (steps, 2)
        first, self.step_losses = self.first_unchecked_step, []
        self.first_unchecked_step += len(reduced)
        for offset, (total, count) in enumerate(reduced.tolist()):
            if not math.isfinite(total / count):
                raise TrainingDiverged(
                    f"the loss became {total / count} at step {first + offset}; nothing was saved after the last "
                    f"good checkpoint in {run_dir}. Lower the learning rate, raise warm-up, or check the data, "
                    "then --resume."
                )

    def summary(self, topology: Topology, stream: Prefetcher) -> dict[str, float]:
        """Means since the last summary, tokens/s, and data_wait: the share of the time spent waiting for batches."""
        keys = sorted(self.sums)
        reduced = all_reduce_sum(torch.stack([self.sums[k] for k in keys]), topology).cpu()
        elapsed = time.perf_counter() - self.started
        record = {}
        for key, (total, count) in zip(keys, reduced.tolist()):
            if key == "tokens":
                record["tokens_per_s"] = total / elapsed
            elif count > 0:
                record[key] = total / count
        record["data_wait"] = stream.waited / elapsed
        self.sums, self.started, stream.waited = {}, time.perf_counter(), 0.0
        return record


def fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
