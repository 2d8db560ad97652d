"""The CPU thread count a long job runs at, chosen while it runs: whichever is fastest on the machine as it is now.

No fixed count is right on a shared host. all-MiniLM-L6-v2 on the 2-core machine, 1,000 real texts (texts/s,
fp32 / int8): quiet, 2 threads 319 / 520 and 1 thread 175 / 330; with another process busy on one core,
2 threads 36 / 25 (OpenMP threads wait for each other at every operation while one of them is not running)
and 1 thread 164 / 311. And a host's load changes while a job runs.

So a job measures instead of guessing. It starts at 1 thread (the count that is never a disaster) and tries
each larger count once; then each batch runs at the count with the lowest recent cost (seconds per unit of
work: real tokens), and every other count is tried again now and then: after PROBE_EVERY batches, and after
each try it loses, after more batches, enough that trying it costs about PROBE_BUDGET of the run (a count
17x slower than the best, 2 threads beside a busy process at torch's default OpenMP spin, waits ~530
batches; one 1.9x slower, 1 thread on a quiet machine, ~30), and at least twice as many as before. A count
whose measured cost jumps (a busy neighbour arrived) loses its place at once to the one last measured
cheaper, which is then measured afresh.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator

# Batches before a count that lost is tried again: PROBE_EVERY at first, then at least twice the last wait, and
# at least what keeps the tries' extra time near PROBE_BUDGET of the run, up to MAX_PROBE_EVERY (so a host
# that has gone quiet is noticed within a minute or two of batches).
PROBE_EVERY = 4
PROBE_BUDGET = 0.03
MAX_PROBE_EVERY = 1024
# Weight of the newest batch in the running count's cost: recent enough to follow the load, smooth enough
# that one slow batch (a page fault, a context switch) does not change the count. A count that is tried
# takes its new measure whole: the old one is as stale as its last try.
NEWEST_WEIGHT = 0.5


def thread_counts(max_threads: int) -> list[int]:
    """The counts worth trying, fewest first: max_threads and its halvings down to 1 (8 -> [1, 2, 4, 8], 6 -> [1, 3, 6])."""
    counts, threads = [], max(1, max_threads)
    while threads >= 1:
        counts.append(threads)
        threads //= 2
    return counts[::-1]


class ThreadGovernor:
    """Picks torch's CPU thread count batch by batch; `run(work)` is the context a batch runs in.

    max_threads: the most threads worth using (engine.threads.usable_threads()).
    set_threads: what applies a count (torch.set_num_threads; a test passes its own), clock: seconds.
    """

    def __init__(self, max_threads: int, set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if set_threads is None:
            import torch

            set_threads = torch.set_num_threads
        self.counts = thread_counts(max_threads)
        self.set_threads, self.clock = set_threads, clock
        self.cost: dict[int, float] = {}  # threads -> seconds per unit of work, recent batches weighted most
        self.probe_every = {threads: PROBE_EVERY for threads in self.counts}
        self.since_tried = {threads: 0 for threads in self.counts}
        self.applied: int | None = None  # the count last set (None: someone else's setting is in force)
        self.warmed_up = False

    @property
    def best(self) -> int:
        """The count with the lowest measured cost (1 before anything is measured)."""
        measured = [threads for threads in self.counts if threads in self.cost]
        return min(measured, key=self.cost.__getitem__) if measured else self.counts[0]

    def next_threads(self) -> int:
        """The count the next batch runs at: a count never measured, or one whose next try is due, else the best."""
        for threads in self.counts:
            if threads not in self.cost and self.warmed_up:
                return threads
        best = self.best
        due = [threads for threads in self.counts
               if threads != best and self.since_tried[threads] >= self.probe_every[threads]]
        return due[0] if due else best

    @contextmanager
    def session(self, get_threads: Callable[[], int] | None = None) -> Iterator["ThreadGovernor"]:
        """A job's batches (`run` inside it); the count in force before it is given back after, so a caller's
        own torch.set_num_threads outlives the job. What was measured is kept for the next session."""
        if get_threads is None:
            import torch

            get_threads = torch.get_num_threads
        before = get_threads()
        try:
            yield self
        finally:
            if self.applied is not None and self.applied != before:
                self.set_threads(before)
            self.applied = None

    @contextmanager
    def run(self, work: float) -> Iterator[int]:
        """Run one batch of `work` units (its real tokens) at the chosen count; yields the count."""
        threads = self.next_threads()
        if threads != self.applied:
            self.set_threads(threads)
            self.applied = threads
        start = self.clock()
        yield threads
        self.record(threads, (self.clock() - start) / max(work, 1.0))

    def record(self, threads: int, cost: float) -> None:
        """Take one batch's cost (seconds per unit of work) at `threads`."""
        if not self.warmed_up:  # the first batch pays one-time costs (allocations, thread start): not a measure
            self.warmed_up = True
            return
        best_before = self.best
        if threads == best_before and threads in self.cost:  # measured batch after batch: smoothed
            self.cost[threads] = NEWEST_WEIGHT * cost + (1 - NEWEST_WEIGHT) * self.cost[threads]
        else:  # a try: what was known of this count is as old as its last try
            self.cost[threads] = cost
        for other in self.counts:
            self.since_tried[other] += 1
        self.since_tried[threads] = 0
        if threads == best_before:
            return
        best = self.best
        if best == threads:  # the tried count won: every other count is worth trying soon again
            self.probe_every = {count: PROBE_EVERY for count in self.counts}
            return
        extra = self.cost[threads] / self.cost[best] - 1  # what one more try costs, in batches of the best
        wait = max(2 * self.probe_every[threads], math.ceil(extra / PROBE_BUDGET))
        self.probe_every[threads] = min(wait, MAX_PROBE_EVERY)
