"""Keeping the device busy: the next batches prepared in the background, results copied back late.

`prefetched` runs a producer (tokenization, batching, pinning) in a thread while the caller
runs the model; the Rust tokenizer releases the GIL, so the two overlap. `HostResults` takes
each batch's vectors as the device finishes them: on a GPU it starts a non-blocking copy into
page-locked memory and reads it only a few batches later, so the host never waits on the
device while there is still work to queue.
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np
import torch
from torch import Tensor

Item = TypeVar("Item")
_DONE = object()


class Producer:
    """The items of an iterable made up to `depth` ahead in a background thread, started on the first `next`.

    `next()` gives the next item, raises StopIteration at the end, and raises the producer's
    exception at the item where it happened. `close()` stops the thread (it finishes the item in
    hand) and drops what it made. The one read-ahead mechanism: `prefetched` for inference,
    train.prefetch.Prefetcher for training.
    """

    def __init__(self, items: Iterable[Item], depth: int):
        self.items = items
        self.ready: queue.Queue = queue.Queue(maxsize=depth)
        self.stopping = threading.Event()
        self.finished = threading.Event()  # set by the thread as it ends (not Thread.join: see engine/workers.py)
        self.thread: threading.Thread | None = None

    def next(self) -> Item:
        if self.thread is None:
            self.thread = threading.Thread(target=self._produce, name="bertforge-prefetch", daemon=True)
            self.thread.start()
        item = self.ready.get()
        if item is _DONE:
            raise StopIteration("the items ended")
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self, timeout: float = 10) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.finished.wait(timeout=timeout)

    def _produce(self) -> None:
        try:
            for item in self.items:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as error:  # handed to the consumer, which raises it where the user can see it
            self._put(error)
        finally:
            self.finished.set()

    def _put(self, item) -> bool:
        """Queue `item` unless the consumer has stopped listening; False when it has."""
        while not self.stopping.is_set():
            try:
                self.ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def prefetched(items: Iterable[Item], depth: int = 4) -> Iterator[Item]:
    """Iterate `items`, produced up to `depth` ahead in a background thread.

    An exception in the producer is raised here, at the item where it happened. Closing the
    iterator early (break, an error in the caller) stops the producer.
    """
    producer = Producer(items, depth)
    try:
        while True:
            try:
                item = producer.next()
            except StopIteration:
                return
            yield item
    finally:
        producer.close(timeout=5)


class HostResults:
    """Writes each batch's vectors into `out[rows]`, in the caller's order whatever the batch order.

    out: (n, dim) float32 host array. `add` takes vectors on any device; CUDA vectors are
    copied back without blocking and written once more than `lag` batches are in flight (or
    at `finish`). `on_written(count)` is told how many rows landed (a progress bar).
    """

    def __init__(self, out: np.ndarray, lag: int = 4, on_written: Callable[[int], None] | None = None):
        self.out, self.lag, self.on_written = out, lag, on_written
        self.pending: deque[tuple[np.ndarray, Tensor, torch.cuda.Event | None]] = deque()

    def add(self, rows: np.ndarray, vectors: Tensor) -> None:
        """rows: (batch,) positions in out; vectors: (batch, dim) float32."""
        event = None
        if vectors.device.type == "cuda":
            host = torch.empty(vectors.shape, dtype=vectors.dtype, pin_memory=True)
            host.copy_(vectors, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            vectors = host
        self.pending.append((rows, vectors, event))
        while len(self.pending) > self.lag:
            self.write_oldest()

    def write_oldest(self) -> None:
        rows, vectors, event = self.pending.popleft()
        if event is not None:
            event.synchronize()  # the copy (and so every kernel before it) has finished
        self.out[rows] = vectors.numpy()
        if self.on_written is not None:
            self.on_written(len(rows))

    def finish(self) -> np.ndarray:
        while self.pending:
            self.write_oldest()
        return self.out
