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
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..engine.pipeline import Producer
from ..engine.unpadding import packing_if_it_pays

Batch = dict[str, Any]


class Prefetcher:
    """A BatchStream (iterable, with state_dict/load_state_dict) read ahead by a thread (engine.pipeline.Producer).

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
        # Started on first use: after a resume has moved the stream.
        self.producer = Producer(self._made(), depth)
        self.waited = 0.0

    @classmethod
    def for_model(cls, batches, model: torch.nn.Module, device: torch.device, pack: bool = True) -> "Prefetcher":
        """`batches` made ahead, each packed on the host when dropping its padding pays on `device` (and pack:
        a step replayed from a CUDA graph takes its batches padded, in one shape)."""
        pack = pack and accepts_packing(model)

        def prepare(batch: Batch) -> Batch:
            if pack and "attention_mask" in batch:
                packing = packing_if_it_pays(batch["attention_mask"], device.type)
                if packing is not None:
                    batch = {**batch, "packing": packing}
            return batch

        return cls(batches, prepare, pin=device.type == "cuda")

    def next_batch(self) -> Batch:
        started = time.perf_counter()
        try:
            batch, self.position = self.producer.next()
        except StopIteration:
            raise StopIteration("the batch stream ended") from None
        finally:
            self.waited += time.perf_counter() - started
        return batch

    def state_dict(self) -> Any:
        return self.position

    def _made(self) -> Iterator[tuple[Batch, Any]]:
        for batch in self.batches:
            # A deep copy: the stream's own state moves on with the next batch.
            yield self._pinned(self.prepare(batch)), copy.deepcopy(self.batches.state_dict())

    def _pinned(self, batch: Batch) -> Batch:
        if not self.pin:
            return batch
        return {key: value.pin_memory() if hasattr(value, "pin_memory") else value for key, value in batch.items()}

    def close(self) -> None:
        """Stop the thread (it finishes the batch in hand) and drop what it made."""
        self.producer.close()


def accepts_packing(model: torch.nn.Module) -> bool:
    """Whether model.forward takes `packing` (every bertforge model does; a user's may not)."""
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == "packing" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)

