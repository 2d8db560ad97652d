"""Dynamic batching for the server: queued inputs of concurrent requests run together.

Each input a request brings (one text, say) waits in a queue; a loop takes from the
front of the queue as many as fit a token budget, runs them in one model call on a
worker thread, and resolves each input's future with its own result, so every caller
gets back exactly its answers in its order. While one batch runs, the next one fills.

The budget counts padded tokens (batch size x longest input), as text-embeddings-
inference does for models that pad: what the batch would cost as one padded forward
pass, an upper bound on its time and memory (the models sort a batch by length before
cutting it into packed passes with the engine's planner, see `passes.py`). The choice is a
pure function, `next_batch_size`.

A forward pass has a fixed cost whatever it holds (on the CPU, streaming the weights from
memory: a 3-token pass of all-MiniLM-L6-v2 took 5 ms, 8 texts 46 ms), so a batch of one text
started the instant the model freed up costs nearly what eight would. When the last batch was
large (concurrent clients) and few inputs are queued, the loop waits a moment for the rest,
at most GATHER_SHARE of the last batch's time; a lone client, whose last batch held one
input, never waits. 16 clients sending one text each (1 thread, a shared 2-core machine, two
pairs of runs): batches of one text fell from 13 and 21 of ~170 to 1 and 7, and the served
rate rose from 49 and 59 to 55 and 68 texts/s.

While a batch runs, the next one is formed and handed to the model thread just before the running
one is expected to end (its real tokens times the last batch's model time per token, LEAD_SHARE
early), or at once when a full batch is already queued; it then starts the moment the model thread
is free. Before, the model thread waited for the event loop to answer the batch it had finished
and form the next: 16 one-text clients on the quiet 2-core machine left it idle 17% of the time
(gaps between batches: median 2.5 ms, mean 9 ms). With the next batch waiting its turn, served
texts/s rose 115-122 -> 124-125 and p99 fell 363-411 -> 334-352 ms (two pairs, raw clients, 1 thread).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..engine.governor import ThreadGovernor

logger = logging.getLogger("bertforge.serve")
# How long a short queue may wait for company, as a share of the last batch's time (see above).
GATHER_SHARE = 0.1
# Batches handed to the model thread at once: the one it runs and the next, formed while it runs.
MAX_IN_FLIGHT = 2
# The next batch is formed this share of the running one's expected time before it ends (at least
# MIN_LEAD_SECONDS): early enough that the model thread never waits for the event loop, late enough
# that it holds the inputs that arrived meanwhile.
LEAD_SHARE = 0.1
MIN_LEAD_SECONDS = 0.002


def next_batch_size(lengths: Sequence[int], max_batch_tokens: int, max_batch_requests: int | None = None) -> int:
    """How many inputs, from the front of the queue, the next batch takes.

    lengths: token counts of the queued inputs, oldest first. Inputs are taken in
    queue order (no overtaking, so no input waits forever) while the padded cost
    (count x longest) stays within max_batch_tokens and the count within
    max_batch_requests. The first input is always taken: a lone input longer than the
    budget runs alone (the server rejects those earlier; see `check_limits`).
    Returns 0 only for an empty queue.
    """
    taken, longest = 0, 0
    for length in lengths:
        if max_batch_requests is not None and taken == max_batch_requests:
            break
        if taken and (taken + 1) * max(longest, length) > max_batch_tokens:
            break
        taken, longest = taken + 1, max(longest, length)
    return taken


class ShuttingDown(RuntimeError):
    """A request arrived after the batcher began to close."""


@dataclass
class BatchFailure:
    """What a failed input resolves to inside the worker: the error, to raise in its caller only."""

    error: BaseException


@dataclass
class Pending:
    payload: Any
    length: int
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class InFlight:
    """A batch handed to the model thread: its inputs, the executor's future, its real tokens, its expected model time."""

    batch: list[Pending]
    future: asyncio.Future
    tokens: int
    expected_seconds: float  # 0 until a batch has been timed
    dispatched: float = field(default_factory=time.perf_counter)


class Batcher:
    """A queue + loop that runs `run_batch(payloads) -> results` (one result per payload, in order).

    run_batch runs on `executor` (one thread, shared by every model, so calls never
    compete for the CPU); it must not touch the event loop. When a batch raises, its
    inputs are re-run one by one, so only the inputs that fail on their own get the
    error: a bad input does not fail its batch-mates. Inputs whose caller went away
    (cancelled futures) are dropped before they reach the model.
    """

    def __init__(self, name: str, run_batch: Callable[[list], list], executor: Executor, *, max_batch_tokens: int,
                 max_batch_requests: int | None = None, metrics=None, gather_share: float = GATHER_SHARE,
                 governor: ThreadGovernor | None = None):
        self.name = name
        self.governor = governor  # picks each batch's CPU thread count, when the server has one
        self.run_batch = run_batch
        self.executor = executor
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.metrics = metrics
        self.queue: deque[Pending] = deque()
        self.wakeup = asyncio.Event()
        self.closing = False
        self.loop_task: asyncio.Task | None = None
        self.gather_share = gather_share
        self.last_size, self.last_seconds = 0, 0.0  # the last batch's inputs and model time
        self.seconds_per_token: float | None = None  # the last batch's model time per real token
        self.in_flight: deque[InFlight] = deque()  # batches handed to the executor, oldest (running) first
        self.running_since = 0.0  # when the model thread began the batch it runs now (set on that thread)

    def start(self) -> None:
        self.loop_task = asyncio.get_running_loop().create_task(self.run(), name=f"batcher-{self.name}")

    async def close(self) -> None:
        """Stop after every queued input has run (graceful shutdown drains, it does not drop)."""
        self.closing = True
        self.wakeup.set()
        if self.loop_task is not None:
            await self.loop_task

    async def submit(self, payloads: list, lengths: list[int]) -> list:
        """Queue one request's inputs; their results in the same order.

        Raises the first error among this request's inputs (see BatchFailure), or
        ShuttingDown once `close` has begun.
        """
        if self.closing:
            raise ShuttingDown("the server is shutting down")
        loop = asyncio.get_running_loop()
        pendings = [Pending(payload, length, loop.create_future()) for payload, length in zip(payloads, lengths)]
        self.queue.extend(pendings)
        self.observe_queue()
        self.wakeup.set()
        try:
            return list(await asyncio.gather(*(p.future for p in pendings)))
        except BaseException:
            # The caller disconnected (CancelledError) or an input failed: the rest of this request's
            # inputs are not wanted any more, and the loop skips cancelled ones still queued.
            for pending in pendings:
                pending.future.cancel()
            raise

    async def run(self) -> None:
        while True:
            self.drop_abandoned()
            if not self.queue:
                if self.closing:
                    await asyncio.gather(*(flight.future for flight in self.in_flight), return_exceptions=True)
                    return
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            if len(self.in_flight) >= MAX_IN_FLIGHT:  # one runs, one waits its turn: form no third
                await asyncio.wait([self.in_flight[0].future])
                continue
            if self.in_flight:
                await self.until_model_nearly_free()
            if not self.in_flight:
                await self.gathered()
            self.drop_abandoned()
            if not self.queue:  # every queued caller left while it gathered
                continue
            self.dispatch()

    def dispatch(self) -> None:
        """Hand the next batch from the front of the queue to the model thread; its callers are answered when it ends."""
        batch = [self.queue.popleft() for _ in range(self.next_count())]
        self.observe_queue()
        tokens = sum(p.length for p in batch)
        future = asyncio.get_running_loop().run_in_executor(self.executor, self.run_timed,
                                                            [p.payload for p in batch], tokens)
        flight = InFlight(batch, future, tokens, tokens * (self.seconds_per_token or 0.0))
        self.in_flight.append(flight)
        future.add_done_callback(lambda _: self.finish(flight))

    def next_count(self) -> int:
        """How many inputs from the front of the queue the next batch takes (`next_batch_size`)."""
        return next_batch_size([p.length for p in self.queue], self.max_batch_tokens, self.max_batch_requests)

    def finish(self, flight: "InFlight") -> None:
        """A batch ended (event loop): record its time, answer its callers."""
        self.in_flight.remove(flight)
        batch = flight.batch
        try:
            results, seconds = flight.future.result()
        except Exception as error:  # the executor itself failed: answer these callers, keep the loop alive
            results, seconds = [BatchFailure(error)] * len(batch), 0.0
        if seconds > 0:
            self.last_size, self.last_seconds = len(batch), seconds
            self.seconds_per_token = seconds / max(flight.tokens, 1)
        self.observe_batch(batch, flight.dispatched, seconds)
        for pending, result in zip(batch, results):
            if pending.future.done():  # cancelled while the batch ran
                continue
            if isinstance(result, BatchFailure):
                pending.future.set_exception(result.error)
            else:
                pending.future.set_result(result)
        self.wakeup.set()

    async def until_model_nearly_free(self) -> None:
        """While a batch runs: return just before it is expected to end (LEAD_SHARE of its time early), when it
        ends, or as soon as a full batch is queued. No estimate yet (the first batch): when it ends."""
        running = self.in_flight[0]
        while not running.future.done() and not self.closing:
            if self.next_count() < len(self.queue):
                return  # more than a batch is waiting: nothing is gained by waiting for more
            left = None
            if running.expected_seconds > 0:
                lead = max(MIN_LEAD_SECONDS, LEAD_SHARE * running.expected_seconds)
                started = self.running_since if self.running_since >= running.dispatched else time.perf_counter()
                left = started + running.expected_seconds - lead - time.perf_counter()
                if left <= 0:
                    return
            self.wakeup.clear()
            woken = asyncio.ensure_future(self.wakeup.wait())
            await asyncio.wait([running.future, woken], timeout=left, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()

    async def gathered(self) -> None:
        """Return when half as many inputs as the last batch held are queued, or the oldest has waited
        gather_share of the last batch's time, or at once when that many are already there."""
        wanted = self.last_size // 2
        deadline = self.queue[0].queued_at + self.gather_share * self.last_seconds
        while len(self.queue) < wanted and not self.closing:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), left)
            except asyncio.TimeoutError:
                return
            self.drop_abandoned()
            if not self.queue:
                return

    def run_timed(self, payloads: list, tokens: int) -> tuple[list, float]:
        """run_isolated and its seconds (worker thread); marks when the model began, for the next batch's timing."""
        self.running_since = started = time.perf_counter()
        with self.governor.run(tokens) if self.governor else contextlib.nullcontext():
            results = self.run_isolated(payloads)
        return results, time.perf_counter() - started

    def run_isolated(self, payloads: list) -> list:
        """run_batch on the whole batch; if that raises, on each payload alone (worker thread)."""
        try:
            return self.run_batch(payloads)
        except Exception as error:
            if len(payloads) == 1:
                return [BatchFailure(error)]
            logger.warning("%s: a batch of %d failed (%s); running its inputs one by one", self.name, len(payloads), error)
        return [self.run_one(payload) for payload in payloads]

    def run_one(self, payload) -> Any:
        try:
            return self.run_batch([payload])[0]
        except Exception as error:
            return BatchFailure(error)

    def drop_abandoned(self) -> None:
        if any(p.future.done() for p in self.queue):
            kept = [p for p in self.queue if not p.future.done()]
            if self.metrics is not None:
                self.metrics.dropped.labels(self.name).inc(len(self.queue) - len(kept))
            self.queue = deque(kept)
            self.observe_queue()

    def observe_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.labels(self.name).set(len(self.queue))

    def observe_batch(self, batch: list[Pending], started: float, seconds: float) -> None:
        if self.metrics is None:
            return
        real_tokens = sum(p.length for p in batch)
        self.metrics.batch_size.labels(self.name).observe(len(batch))
        self.metrics.batch_tokens.labels(self.name).observe(len(batch) * max(p.length for p in batch))
        self.metrics.tokens.labels(self.name).inc(real_tokens)
        self.metrics.inference_seconds.labels(self.name).observe(seconds)
        for pending in batch:
            self.metrics.queue_seconds.labels(self.name).observe(started - pending.queued_at)
