"""Batches made ahead of the training step, in a background thread, with exact positions for resume.

The step should never wait for the next batch to be cut, masked, collated and packed: a thread
does that while the current step runs (on a GPU the step is queued kernels, so the host is free;
on a CPU the thread takes a core the step leaves idle between its parallel regions). The
stream's position after each batch travels with it, so a checkpoint saves where training
stands, not where the thread has got to, and resuming continues with the very next batch.
"""
from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

Batch = dict[str, Any]
_END = object()


class Prefetcher:
    """Iterate `batches` ahead of the loop: `next()` gives (batch, position after it).

    prepare: host-side work per batch (e.g. packing from the attention mask), run in the thread.
    pin: page-locked memory, so the loop's `to(device, non_blocking=True)` overlaps the copy.
    depth: batches kept ready. `waited` accumulates the seconds `next()` spent blocked on the thread.
    An exception in the thread (bad data, a collate error) is raised by the `next()` that reaches it.
    """

    def __init__(self, batches: Iterable[Batch], position: Callable[[], Any], prepare: Callable[[Batch], Batch],
                 pin: bool = False, depth: int = 2):
        self.batches, self.position, self.prepare, self.pin = batches, position, prepare, pin
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.waited = 0.0

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self) -> tuple[Batch, Any]:
        if self.thread is None:  # started on first use: after a resume has moved the stream
            self.thread = threading.Thread(target=self._produce, name="bertforge-prefetch", daemon=True)
            self.thread.start()
        started = time.perf_counter()
        item = self.ready.get()
        self.waited += time.perf_counter() - started
        if item is _END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def _produce(self) -> None:
        try:
            for batch in self.batches:
                # A deep copy: the stream's own state moves on with the next batch.
                item = (self._pinned(self.prepare(batch)), copy.deepcopy(self.position()))
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as error:  # handed to the loop, which raises it where the user can see it
            self._put(error)

    def _put(self, item) -> bool:
        """Queue `item` unless the loop has stopped listening; False when it has."""
        while not self.stopping.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _pinned(self, batch: Batch) -> Batch:
        if not self.pin:
            return batch
        return {key: value.pin_memory() if hasattr(value, "pin_memory") else value for key, value in batch.items()}

    def close(self) -> None:
        """Stop the thread (it finishes the batch in hand) and drop what it made."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=10)


def to_device(batch: Batch, device: torch.device) -> Batch:
    """Every tensor (and Packing) of `batch` on `device`; asynchronous from pinned memory."""
    non_blocking = device.type == "cuda"
    return {key: value.to(device, non_blocking=non_blocking) if hasattr(value, "to") else value
            for key, value in batch.items()}
