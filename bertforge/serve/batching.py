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
memory: a 3-token pass of all-MiniLM-L6-v2 took 5 ms, 8 texts 46 ms), so concurrent clients are
best served in one batch together. When a batch that answered several requests ends, its callers
send their next ones a few milliseconds later (8 ms for 16 one-text clients on these 2 cores);
the loop waits for them: until as many requests came since the batch ended as it answered, at
most GATHER_SHARE of its time (counted from when it ended, or from the oldest queued input if
later), and not at all once the queue fills GATHER_UNTIL_FULL of the token budget (a pass that
large costs hardly more a token than a fuller one). A lone client, answered one request a batch,
never waits, whatever its requests hold.

While a batch runs, the next one is handed to the model thread at once only when the queue fills
GATHER_UNTIL_FULL of the budget (heavy load: the model never waits for the event loop; 4 clients x
32 texts, alternating runs: 0.93, 0.96, 0.95 against 0.89, 0.92, 0.94 when it took more than a
whole batch queued, and half the event loop's CPU a request). Otherwise the loop waits for the
running batch to end, so clients do not split into two cohorts that alternate
in half-size batches. That is what the loop did before 2026-11-26, when it handed over whatever
was queued just before the running batch ended: 16 one-text clients (raw clients, 1 thread, the
quiet 2-core Xeon) ran in batches of 7.9 at 6.5 ms of model time a text against direct `embed`'s
5.4, efficiency 0.80-0.82. Now: batches of 15.3 at 5.0-5.1 ms a text (direct's), the model idle
10% of the run (its callers' round trip), efficiency 0.87-0.89; 4 clients x 32 texts 0.93-0.97
(before: 0.99 in one run, 0.94-1.02 on earlier days). With less event-loop work per request since
(docs/serve.md), 0.90-0.91 at 16 x 1.
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
# How long the queue may wait for the last batch's callers, as a share of that batch's time (see above): a
# quarter, as 16 clients split into two cohorts of 8 come back 8 ms after a 45 ms batch and must be waited for.
GATHER_SHARE = 0.25
# ... unless the queue already fills this share of --max-batch-tokens (4,096 of TEI's 16,384), which is then also
# handed over while a batch runs: 4 clients x 32 texts waited for company at half, and the model stood idle 4% of
# the run for batches no cheaper a text.
GATHER_UNTIL_FULL = 0.25
# Batches handed to the model thread at once: the one it runs and, under heavy load, the next.
MAX_IN_FLIGHT = 2


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
    ends_request: bool = True  # the last input of its request: the batch that runs it answers a caller
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class InFlight:
    """A batch handed to the model thread: its inputs and the executor's future."""

    batch: list[Pending]
    future: asyncio.Future
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
        self.last_callers, self.last_seconds = 0, 0.0  # the requests the last batch answered, its model time
        self.last_finished = 0.0  # when the last batch's callers were answered
        self.in_flight: deque[InFlight] = deque()  # batches handed to the executor, oldest (running) first

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
        pendings = [Pending(payload, length, loop.create_future(), ends_request=index == len(payloads) - 1)
                    for index, (payload, length) in enumerate(zip(payloads, lengths))]
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
                await self.until_model_free()
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
        flight = InFlight(batch, future)
        self.in_flight.append(flight)
        future.add_done_callback(lambda _: self.finish(flight))

    def fills_enough(self) -> bool:
        """Whether the queue, as one padded batch (inputs x longest, next_batch_size's measure), fills GATHER_UNTIL_FULL
        of the token budget: a pass that large waits for no company, and may be handed over while one runs."""
        return len(self.queue) * max((p.length for p in self.queue), default=0) >= GATHER_UNTIL_FULL * self.max_batch_tokens

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
            self.last_callers, self.last_seconds = sum(p.ends_request for p in batch), seconds
        self.observe_batch(batch, flight.dispatched, seconds)
        for pending, result in zip(batch, results):
            if pending.future.done():  # cancelled while the batch ran
                continue
            if isinstance(result, BatchFailure):
                pending.future.set_exception(result.error)
            else:
                pending.future.set_result(result)
        self.last_finished = time.perf_counter()
        self.wakeup.set()

    async def until_model_free(self) -> None:
        """While a batch runs: return when it ends, or at once when the queue fills enough (`fills_enough`) or holds
        more than a batch (then the next one is handed over to start the moment the model thread is free)."""
        running = self.in_flight[0]
        while not running.future.done() and not self.closing:
            if self.fills_enough() or self.next_count() < len(self.queue):  # the cheap test first: one pass, no list
                return
            self.wakeup.clear()
            woken = asyncio.ensure_future(self.wakeup.wait())
            await asyncio.wait([running.future, woken], return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()

    async def gathered(self) -> None:
        """After a batch that answered several requests, wait for its callers' next ones (see the module docstring):
        return once as many requests came since it ended, or the queue fills GATHER_UNTIL_FULL of a batch's tokens, or
        at the deadline, gather_share of the last batch's time after it ended (or after the oldest input came)."""
        if self.last_callers <= 1:
            return
        deadline = max(self.queue[0].queued_at, self.last_finished) + self.gather_share * self.last_seconds
        while not self.closing and not self.fills_enough():
            if sum(p.ends_request and p.queued_at > self.last_finished for p in self.queue) >= self.last_callers:
                return  # as many requests came since the batch ended as it answered: its callers are back
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
        """run_isolated and its seconds (worker thread)."""
        started = time.perf_counter()
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
