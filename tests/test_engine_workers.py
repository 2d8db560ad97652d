"""A long CPU encode shared among single-threaded workers (engine/workers.py): every batch once, the vectors of
a batch-by-batch run in the caller's order, torch's thread count given back, and errors raised to the caller."""
import threading

import numpy as np
import pytest
import torch

from bertforge import BertModel
from bertforge.embeddings import embed as embed_module
from bertforge.embeddings.embed import Embedder
from bertforge.engine.workers import run_in_workers, worth_workers
from bertforge.tokenization.tokenizer import BertTokenizer


@pytest.fixture(scope="module")
def cassette(cassette_dir):
    return BertModel.from_pretrained(cassette_dir), BertTokenizer.from_pretrained(cassette_dir)


@pytest.fixture(scope="module")
def texts(data_dir):
    lines = [line.strip() for line in (data_dir / "austen" / "emma.txt").read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line][:300:3]  # 100 lines of every length Emma has


def test_every_batch_runs_once_on_one_thread_in_inference_mode():
    seen, names, lock = [], set(), threading.Lock()

    def work(batch):
        assert torch.get_num_threads() == 1 and torch.is_inference_mode_enabled()
        with lock:
            seen.append(batch)
            names.add(threading.current_thread().name)

    torch.set_num_threads(2)
    run_in_workers(iter(range(40)), work, workers=3)
    assert sorted(seen) == list(range(40))
    assert names <= {f"bertforge-worker-{i}" for i in range(3)}
    assert torch.get_num_threads() == 2  # the caller's count, given back


@pytest.mark.parametrize("where", ["work", "batches"])
def test_the_first_error_stops_the_workers_and_reaches_the_caller(where):
    done = []

    def batches():
        for i in range(100):
            if where == "batches" and i == 5:
                raise ValueError("a bad text at 5")
            yield i

    def work(batch):
        if where == "work" and batch == 5:
            raise ValueError("a bad text at 5")
        done.append(batch)

    with pytest.raises(ValueError, match="a bad text at 5"):
        run_in_workers(batches(), work, workers=2)
    assert len(done) < 100  # stopped, not run to the end


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as an interactive user has it: pytest-xdist's workers start with it ignored."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers can be set from the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_stops_the_workers_and_reaches_the_caller(ctrl_c_raises):
    """A signal may land on a worker thread; the caller, waiting for them, must still raise KeyboardInterrupt."""
    import _thread
    import time

    done = []

    def work(batch):
        if batch == 0:
            _thread.interrupt_main()  # SIGINT as Python sees it: a flag only the main thread acts on
        time.sleep(0.01)
        done.append(batch)

    with pytest.raises(KeyboardInterrupt):
        run_in_workers(iter(range(1000)), work, workers=2)
    assert len(done) < 1000  # stopped, not run to the end
    assert not any(t.name.startswith("bertforge-worker") for t in threading.enumerate())  # none left running


def test_only_jobs_of_several_batches_a_worker_are_shared():
    assert not worth_workers(1, batches=100)
    assert not worth_workers(2, batches=3)
    assert worth_workers(2, batches=4)


def test_workers_give_the_batch_by_batch_vectors_in_order(cassette, texts, monkeypatch):
    model, tokenizer = cassette
    torch.set_num_threads(2)
    embedder = Embedder(model, tokenizer, batch_size=8, normalize=True)
    assert embedder.cpu_workers() == 2
    shared = embedder.encode(texts)  # 13 batches of at most 8: shared between 2 workers
    assert torch.get_num_threads() == 2
    monkeypatch.setattr(embed_module, "worth_workers", lambda workers, batches: False)
    one_by_one = embedder.encode(texts)
    assert np.abs(shared - one_by_one).max() < 1e-5
    reversed_order = Embedder(model, tokenizer, batch_size=8, normalize=True).encode(texts[::-1])
    assert np.abs(reversed_order[::-1] - one_by_one).max() < 1e-5


def test_the_worker_count_follows_the_threads_the_encode_would_use(cassette, monkeypatch):
    model, tokenizer = cassette
    torch.set_num_threads(1)
    assert Embedder(model, tokenizer).cpu_workers() == 1  # one thread: batch by batch, as before
    monkeypatch.setattr("bertforge.engine.threads.usable_threads", lambda: 3)
    assert Embedder(model, tokenizer, threads="auto").cpu_workers() == 3  # chosen: one worker per usable core


def test_a_callers_progress_hook_is_told_every_row_a_batch_at_a_time(cassette, texts, monkeypatch):
    """`encode(on_rows=...)`: an index build's bar over its chunks moves as batches land, with workers or without."""
    model, tokenizer = cassette
    torch.set_num_threads(2)
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(embed_module, "worth_workers", lambda workers, batches: False)
        told = []
        Embedder(model, tokenizer, batch_size=8, progress=False).encode(texts, on_rows=told.append)
        assert sum(told) == len(texts) and len(told) > 1


def test_an_interrupted_caller_waits_for_every_batch_in_hand_even_when_threading_says_they_ended(ctrl_c_raises,
                                                                                                 monkeypatch):
    """Python 3.11's Thread.join, interrupted by Ctrl-C, can mark a running thread as stopped (bpo-45274's
    handling); a worker left running its torch op while the process exits aborts it ("terminate called"). So the
    caller must not trust is_alive: here it always says False, and every batch begun must still end first."""
    import _thread
    import time

    monkeypatch.setattr(threading.Thread, "is_alive", lambda thread: False)
    begun, ended = [], []

    def work(batch):
        begun.append(batch)
        if batch == 0:
            _thread.interrupt_main()
        time.sleep(0.2)
        ended.append(batch)

    with pytest.raises(KeyboardInterrupt):
        run_in_workers(iter(range(100)), work, workers=2)
    assert sorted(begun) == sorted(ended) and len(ended) < 100
