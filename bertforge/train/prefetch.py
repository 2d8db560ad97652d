"""Batches made ahead of the training step, in a background thread, with exact positions for resume.

The step should never wait for the next batch to be cut, masked, collated and packed: a thread
does that while the current step runs (on a GPU the step is queued kernels, so the host is free;
on a CPU the thread takes a core the step leaves idle between its parallel regions). The
stream's position after each batch travels with it, so a checkpoint saves where training
stands, not where the thread has got to, and resuming continues with the very next batch.
"""
from __future__ import annotations

import copy
import inspect
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..engine.unpadding import packing_if_it_pays

Batch = dict[str, Any]
_END = object()


class Prefetcher:
    """A BatchStream (iterable, with state_dict/load_state_dict) read ahead by a thread.

    prepare: host-side work per batch (packing from the attention mask), run in the thread.
    pin: page-locked memory, so the loop's `to(device, non_blocking=True)` overlaps the copy.
    depth: batches kept ready. `waited` accumulates the seconds `next_batch()` spent blocked on the
    thread. state_dict() is the stream's position after the last batch handed out. An exception in
    the thread (bad data, a collate error) is raised by the `next_batch()` that reaches it.
    """

    def __init__(self, batches, prepare: Callable[[Batch], Batch] = lambda batch: batch, pin: bool = False,
                 depth: int = 2):
        self.batches, self.prepare, self.pin = batches, prepare, pin
        self.position = batches.state_dict()  # before anything is read: where a resume left the stream
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.waited = 0.0

    def next_batch(self) -> Batch:
        if self.thread is None:  # started on first use: after a resume has moved the stream
            self.thread = threading.Thread(target=self._produce, name="bertforge-prefetch", daemon=True)
            self.thread.start()
        started = time.perf_counter()
        item = self.ready.get()
        self.waited += time.perf_counter() - started
        if item is _END:
            raise StopIteration("the batch stream ended")
        if isinstance(item, BaseException):
            raise item
        batch, self.position = item
        return batch

    def state_dict(self) -> Any:
        return self.position

    def _produce(self) -> None:
        try:
            for batch in self.batches:
                # A deep copy: the stream's own state moves on with the next batch.
                item = (self._pinned(self.prepare(batch)), copy.deepcopy(self.batches.state_dict()))
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


def accepts_packing(model: torch.nn.Module) -> bool:
    """Whether model.forward takes `packing` (every bertforge model does; a user's may not)."""
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == "packing" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def prefetched(batches, model: torch.nn.Module, device: torch.device) -> Prefetcher:
    """`batches` made ahead in a thread, each packed on the host when dropping its padding pays on `device`."""
    pack = accepts_packing(model)

    def prepare(batch: Batch) -> Batch:
        if pack and "attention_mask" in batch:
            packing = packing_if_it_pays(batch["attention_mask"], device.type)
            if packing is not None:
                batch = {**batch, "packing": packing}
        return batch

    return Prefetcher(batches, prepare, pin=device.type == "cuda")

