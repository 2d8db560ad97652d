"""The thread count chosen while a job runs: the fastest on the machine as it is now, given back after."""
import os

import pytest

from bertforge.engine import threads as engine_threads
from bertforge.engine.governor import MAX_PROBE_EVERY, PROBE_EVERY, ThreadGovernor, thread_counts
from bertforge.engine.threads import spin_briefly, thread_governor


class Machine:
    """A fake CPU: seconds per token at each thread count, changed by the test; a clock the batches advance."""

    def __init__(self, cost):
        self.cost, self.now, self.threads = dict(cost), 0.0, 4
        self.history: list[int] = []

    def clock(self):
        return self.now

    def set_threads(self, threads):
        self.threads = threads

    def run_batches(self, governor, count, tokens=1000):
        for _ in range(count):
            with governor.run(tokens) as threads:
                assert threads == self.threads
                self.now += self.cost[threads] * tokens
                self.history.append(threads)


def governed(machine, max_threads=2):
    return ThreadGovernor(max_threads, set_threads=machine.set_threads, clock=machine.clock)


def test_the_counts_tried_are_the_halvings():
    assert thread_counts(8) == [1, 2, 4, 8] and thread_counts(6) == [1, 3, 6]
    assert thread_counts(2) == [1, 2]
    assert thread_counts(1) == [1] and thread_counts(0) == [1]


def test_a_quiet_machine_keeps_all_cores_and_tries_fewer_rarely():
    machine = Machine({2: 1.0, 1: 1.8})  # 2 threads 1.8x faster, as all-MiniLM-L6-v2 on 2 quiet cores
    governor = governed(machine)
    machine.run_batches(governor, 500)
    assert machine.history[:3] == [1, 1, 2]  # a warm-up batch, a measured one, then the larger count tried
    assert governor.best == 2
    assert machine.history.count(1) <= 8  # tried again after ever longer waits (6, 34, 89, 198, 415): ~1% of the run
    assert governor.probe_every[1] >= 8 * PROBE_EVERY


def test_a_busy_neighbour_moves_the_job_to_one_thread_at_once_and_back_when_it_leaves():
    machine = Machine({2: 1.0, 1: 1.8})
    governor = governed(machine)
    machine.run_batches(governor, 100)
    machine.cost[2] = 12.0  # another process takes a core: 2 threads wait on each other
    machine.run_batches(governor, 300)
    after_arrival = machine.history[100:]
    assert after_arrival[:3].count(2) <= 1  # one slow batch, then the count last measured cheaper
    assert after_arrival.count(2) <= 3  # a try of 2 threads costs 12 batches now: they wait long
    assert governor.best == 1
    machine.cost[2] = 1.0  # the neighbour is gone
    machine.run_batches(governor, MAX_PROBE_EVERY + 20)
    assert machine.history[-10:] == [2] * 10


def test_the_first_batch_is_not_a_measurement():
    machine = Machine({2: 1.0, 1: 1.8})
    governor = governed(machine)
    machine.cost[2] = 100.0  # the first batch pays for thread start-up and allocations
    machine.run_batches(governor, 1)
    machine.cost[2] = 1.0
    machine.run_batches(governor, 30)
    assert governor.best == 2 and governor.cost[2] == 1.0
    assert machine.history[1:].count(2) >= 25


def test_a_session_gives_back_the_count_that_was_in_force():
    machine = Machine({2: 1.0, 1: 1.8})
    governor = governed(machine)
    machine.threads = 3
    with governor.session(get_threads=lambda: 3):
        machine.run_batches(governor, 5)
        assert machine.threads in (1, 2)
    assert machine.threads == 3 and governor.applied is None
    with governor.session(get_threads=lambda: 3):  # what was measured is kept: no second warm-up
        machine.run_batches(governor, 1)
    assert 1 in governor.cost and 2 in governor.cost


def test_who_chooses_the_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(engine_threads, "_chosen_while_running", False)
    assert thread_governor(None) is None  # a library user's torch count is theirs
    assert isinstance(thread_governor("auto"), ThreadGovernor)
    engine_threads.use_threads(None)  # a command without --threads
    assert isinstance(thread_governor(None), ThreadGovernor)
    engine_threads.use_threads(1)  # --threads 1
    assert thread_governor(None) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's count
    engine_threads.use_threads(None)
    assert thread_governor(None) is None
    with pytest.raises(ValueError, match="torch.set_num_threads"):
        thread_governor(2)


def test_openmp_spins_briefly_unless_the_user_chose():
    environ = {}
    spin_briefly(environ)
    assert environ == {"GOMP_SPINCOUNT": engine_threads.SHORT_SPIN}
    for chosen in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        environ = dict(chosen)
        spin_briefly(environ)
        assert environ == chosen


def test_commands_start_openmp_with_a_short_spin(tmp_path):
    import subprocess
    import sys

    code = ("import os; from bertforge.cli.parser import main; "
            f"code = main(['embed', {str(tmp_path / 'missing.txt')!r}, {str(tmp_path / 'out.npy')!r}]); "
            "print(code, os.environ.get('GOMP_SPINCOUNT'))")
    environ = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ)
    assert finished.stdout.split() == ["1", engine_threads.SHORT_SPIN]  # a user error, after the spin was set


def test_an_embedder_choosing_its_threads_gives_the_same_vectors_and_hands_the_count_back(minilm_dir, monkeypatch):
    """A job too short for workers (engine/workers.py), whose batches run one by one at the chosen count."""
    import numpy as np
    import torch

    from bertforge.embeddings import embed as embed_module
    from bertforge.embeddings.embed import Embedder

    monkeypatch.setattr(embed_module, "worth_workers", lambda workers, batches: False)
    texts = [f"sentence number {i} about ships and the navy" * (1 + i % 3) for i in range(40)]
    fixed = Embedder.from_pretrained(minilm_dir, batch_size=4).encode(texts)
    chosen = Embedder.from_pretrained(minilm_dir, batch_size=4, threads="auto")
    torch.set_num_threads(1)
    vectors = chosen.encode(texts)
    assert torch.get_num_threads() == 1
    assert len(chosen.governor.cost) == len(chosen.governor.counts)  # every count was measured
    np.testing.assert_allclose(vectors, fixed, atol=1e-5)
