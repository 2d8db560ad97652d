"""A long CPU job's batches shared among single-threaded workers, one per core, instead of every core on each batch.

torch splits each operation of a batch across its threads, and the threads wait for each other at the end of
every operation: the small products of a sentence encoder (a batch of ~1,000 tokens, 384 wide) and its
per-length attention calls leave them waiting. Workers that each take a whole batch on one thread never wait
for each other. all-MiniLM-L6-v2, the 1,000 mixed texts of benchmarks/bench_inference.py, the 2-core AMD EPYC,
fp32: 2 threads on each batch 102-126 texts/s, 2 workers of 1 thread 142-146 (the same vectors, within float32
rounding). Beside a process busy on one core, the worker on the other core keeps its pace; threads that wait
for each other lose most of theirs (engine/governor.py).

Each worker has its own autograd state (inference mode is per thread) and torch's thread count of 1 (per
thread under OpenMP); the count in force before the job is set again after it.

Each worker says it is done with an event of its own, not through Thread.join / is_alive: on Python 3.11 a Ctrl-C
that lands inside join() can mark a still-running thread as stopped (threading's bpo-45274 handling); such a worker
was not waited for, and the process aborted under its running torch op ("terminate called").
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable, TypeVar

import torch

Batch = TypeVar("Batch")
# Fewer batches than this per worker: the job is too short to share (the last batch of each worker is the tail
# the others wait for), and the caller runs it batch by batch on all its threads.
MIN_BATCHES_PER_WORKER = 2
# How often the caller wakes while the workers run: Python runs a signal's handler (Ctrl-C's KeyboardInterrupt) in
# the main thread only, and a main thread blocked in a plain join would sleep through it to the job's end.
JOIN_POLL_SECONDS = 0.1


def worth_workers(workers: int, batches: int) -> bool:
    """Whether `batches` batches (at least; an estimate) are worth sharing among `workers` workers."""
    return workers > 1 and batches >= MIN_BATCHES_PER_WORKER * workers


def run_in_workers(batches: Iterable[Batch], work: Callable[[Batch], None], workers: int) -> None:
    """Call `work(batch)` for every batch, in `workers` threads of one torch thread each, in inference mode.

    Batches are taken in order as workers become free (`batches` is read under a lock: a generator will do);
    `work` must be safe to call from several threads at once for different batches. The first exception, in
    `batches` or in `work`, stops every worker after its current batch and is raised here.
    """
    source, lock, errors = iter(batches), threading.Lock(), []

    def next_batch():
        with lock:
            if errors:
                return None
            try:
                return (next(source),)
            except StopIteration:
                return None
            except BaseException as error:  # the producer's error, raised by the caller below
                errors.append(error)
                return None

    def loop(done: threading.Event) -> None:
        try:
            torch.set_num_threads(1)
            with torch.inference_mode():
                while (taken := next_batch()) is not None:
                    try:
                        work(taken[0])
                    except BaseException as error:
                        with lock:
                            errors.append(error)
                        return
        finally:
            done.set()

    before = torch.get_num_threads()
    finished = [threading.Event() for _ in range(workers)]
    threads = [threading.Thread(target=loop, args=(done,), name=f"bertforge-worker-{i}", daemon=True)
               for i, done in enumerate(finished)]
    try:
        for thread in threads:
            thread.start()
        for done in finished:
            while not done.wait(JOIN_POLL_SECONDS):  # a wait without a timeout never wakes for Ctrl-C
                pass
        for thread in threads:  # past their last batch: only returning is left
            thread.join()
    except BaseException as interrupted:  # Ctrl-C while waiting: the workers stop after their batch
        with lock:
            errors.append(interrupted)
        for done, thread in zip(finished, threads):  # and are waited for: a process that exits under a running
            if thread.ident is not None:  # torch op aborts (a thread never started has nothing to wait for)
                done.wait()
                thread.join(timeout=1)
        raise
    finally:
        torch.set_num_threads(before)  # the workers' count of 1 is also torch's default for new threads
    if errors:
        raise errors[0]
