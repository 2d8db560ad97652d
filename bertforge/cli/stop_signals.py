"""SIGINT and SIGTERM while a command runs: both stop it as Ctrl-C does, and the boundary remembers that they came.

SIGTERM (what `kill`, a scheduler or a container stop sends) raises KeyboardInterrupt like Ctrl-C, so a command
ends cleanly with its one-line message; training saves a checkpoint first (train/interrupt.py takes both signals
over while it runs). Remembering matters because a library can swallow the KeyboardInterrupt and raise an error of
its own in its place: torch loading a checkpoint said "could not determine the shape of object type
'torch.storage.UntypedStorage'" (2 of 40 tries of `bertforge serve` stopped while it loads), which the user would
read as a broken model. An error after a stop signal is the stop.
"""
from __future__ import annotations

import signal


class StopSignals:
    """A context manager: while it is open, SIGINT and SIGTERM raise KeyboardInterrupt and `received` names the
    last one that came. Only handlers still at Python's defaults are taken over: a process started with SIGINT
    ignored (in the background of a script, under nohup) keeps ignoring it. Outside the main thread (the CLI
    called from a worker thread) signals are left alone."""

    DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        try:
            for number, default in self.DEFAULTS.items():
                if signal.getsignal(number) is default:
                    self._previous[number] = signal.signal(number, self._stop)
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(self, *exception) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _stop(self, number: int, frame) -> None:
        self.received = signal.Signals(number).name
        raise KeyboardInterrupt(self.message())

    def message(self) -> str:
        """The one line for a command this signal stopped (`boundary.report` prefixes it)."""
        return "interrupted" if self.received == "SIGINT" else f"interrupted by {self.received}"
