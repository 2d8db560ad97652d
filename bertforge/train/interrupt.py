"""Ctrl-C and SIGTERM during training: finish the step, save a checkpoint, then stop with a message.

Without this, Ctrl-C raised KeyboardInterrupt wherever the step happened to be (a 40-line
traceback) and nothing was saved since the last `save_every`; SIGTERM (a scheduler's time
limit, `docker stop`) killed the run the same way. Here the first signal is a request the loop
honours at the end of the current step; a second one stops at once, as Ctrl-C usually does.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import torch

from ..errors import TrainingInterrupted
from .checkpointing import checkpoint_folder
from .distributed import Topology, all_reduce_sum

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequests:
    """Records SIGINT/SIGTERM while installed; `requested()` asks (all ranks agree on the answer)."""

    def __init__(self):
        self.received: str | None = None
        self.previous: dict[int, object] = {}

    def install(self) -> "StopRequests":
        """Take over SIGINT and SIGTERM (only the main thread can; elsewhere signals stay as they were)."""
        if threading.current_thread() is threading.main_thread():
            self.previous = {number: signal.signal(number, self.request) for number in SIGNALS}
        return self

    def uninstall(self) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
        self.previous = {}

    def request(self, number: int, frame) -> None:
        if self.received is not None:  # asked twice: stop now, without the checkpoint
            raise KeyboardInterrupt(f"interrupted again by {signal.Signals(number).name}: stopped without saving")
        self.received = signal.Signals(number).name

    def requested(self, topology: Topology) -> bool:
        """Whether any rank got a signal (ranks must stop at the same step, or the others wait forever)."""
        if not topology.distributed:
            return self.received is not None
        return all_reduce_sum(torch.tensor([float(self.received is not None)]), topology).item() > 0

    def raise_if_requested(self, step: int, run_dir: Path, topology: Topology) -> None:
        """After the last step: a request that came once the loop had last asked (while the final evaluation or
        save ran) would otherwise be dropped, and the command would go on with what follows training. The run is
        whole and saved; it stops as asked."""
        if self.requested(topology):
            raise self.interrupted(step, run_dir)

    def interrupted(self, step: int, run_dir: Path) -> TrainingInterrupted:
        return TrainingInterrupted(f"interrupted by {self.received or 'a signal on another rank'} at step {step}; "
                                   f"saved {checkpoint_folder(run_dir, step)}")
