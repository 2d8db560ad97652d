"""The server's batcher: which queued inputs form a batch, and that each caller gets its own answers."""
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("prometheus_client")
from bertforge.serve.batching import Batcher, length_groups, next_batch_size  # noqa: E402
from bertforge.serve.metrics import ServerMetrics  # noqa: E402
from bertforge.serve.models import in_length_order  # noqa: E402


# --- next_batch_size: the pure rule ----------------------------------------------------------

def test_an_empty_queue_makes_no_batch():
    assert next_batch_size([], 100) == 0


def test_the_budget_counts_padded_tokens():
    # 2 x 10 = 20, then 3 x 50 = 150 > 100: the long third input waits for the next batch.
    assert next_batch_size([10, 10, 50], 100) == 2
    assert next_batch_size([10, 10, 30], 100) == 3  # 3 x 30 = 90
    assert next_batch_size([50, 10, 10], 100) == 2  # 2 x 50 = 100 fits exactly; 3 x 50 does not


def test_inputs_are_taken_in_queue_order_without_overtaking():
    # A short input behind a long one that does not fit is not pulled forward.
    assert next_batch_size([40, 40, 90, 5], 100) == 2


def test_a_lone_input_over_the_budget_still_runs():
    assert next_batch_size([500, 10], 100) == 1


def test_max_batch_requests_caps_the_count():
    assert next_batch_size([1] * 10, 1000, max_batch_requests=4) == 4


@given(st.lists(st.integers(1, 512), max_size=60), st.integers(1, 4096), st.none() | st.integers(1, 16))
def test_batches_are_within_budget_and_maximal(lengths, budget, cap):
    taken = next_batch_size(lengths, budget, cap)
    if not lengths:
        assert taken == 0
        return
    assert 1 <= taken <= len(lengths)
    if taken > 1:
        assert taken * max(lengths[:taken]) <= budget
    if cap is not None:
        assert taken <= cap
    if taken < len(lengths) and (cap is None or taken < cap):  # one more would break the budget
        assert (taken + 1) * max(lengths[:taken + 1]) > budget


# --- length_groups: forward passes inside a batch ---------------------------------------------

def test_a_long_input_runs_alone_rather_than_padding_the_rest():
    assert length_groups([200] + [20] * 14, overhead=32) == [1, 14]  # 232 + 312, not 15 x 200
    assert length_groups([30, 28, 27, 25], overhead=32) == [4]  # near-equal lengths: one pass
    assert length_groups([], overhead=32) == []
    assert length_groups([9, 9, 9], overhead=0) == [3]  # equal lengths are never split


def padded_cost(lengths, sizes, overhead):
    cost, start = 0, 0
    for size in sizes:
        cost += size * lengths[start] + overhead
        start += size
    return cost


@given(st.lists(st.integers(1, 64), max_size=9).map(lambda v: sorted(v, reverse=True)), st.integers(0, 64))
def test_length_groups_are_the_cheapest_cut(lengths, overhead):
    sizes = length_groups(lengths, overhead)
    assert sum(sizes) == len(lengths) and all(size > 0 for size in sizes)
    cheapest = min((padded_cost(lengths, cut, overhead) for cut in all_cuts(len(lengths))), default=0)
    assert padded_cost(lengths, sizes, overhead) == cheapest  # against every possible cut


def all_cuts(n):
    if n == 0:
        yield []
        return
    for first in range(1, n + 1):
        for rest in all_cuts(n - first):
            yield [first, *rest]


def test_length_groups_refuse_unsorted_lengths():
    with pytest.raises(ValueError, match="sorted longest first"):
        length_groups([1, 5])


def test_a_batch_runs_in_length_sorted_passes_and_answers_in_its_own_order():
    passes = []

    def run(payloads):
        passes.append(payloads)
        return [f"<{p}>" for p in payloads]

    payloads = ["b" * 20, "a" * 21, "long" * 50, "c" * 19]
    assert in_length_order(run, payloads, [len(p) for p in payloads]) == [f"<{p}>" for p in payloads]
    assert passes == [["long" * 50], ["a" * 21, "b" * 20, "c" * 19]]


# --- Batcher: concurrency, isolation, cancellation, draining ---------------------------------

class HeldModel:
    """A run_batch that records its batches and, while `hold` is clear, blocks the model thread."""

    def __init__(self, fail_on=None):
        self.batches: list[list] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail_on = fail_on

    def __call__(self, payloads: list) -> list:
        self.batches.append(list(payloads))
        self.hold.wait(timeout=10)
        if self.fail_on is not None and self.fail_on in payloads:
            raise RuntimeError(f"cannot take {self.fail_on!r}")
        return [f"answer to {p}" for p in payloads]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=20))


async def started(model, **options) -> Batcher:
    batcher = Batcher("test", model, ThreadPoolExecutor(1), max_batch_tokens=options.pop("max_batch_tokens", 1000),
                      **options)
    batcher.start()
    return batcher


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_concurrent_requests_share_a_batch_and_get_their_own_answers_in_order():
    model = HeldModel()

    async def scenario():
        batcher = await started(model)
        model.hold.clear()
        first = asyncio.create_task(batcher.submit(["a"], [3]))
        await until(lambda: len(model.batches) == 1)  # the model is busy with ["a"]
        others = [asyncio.create_task(batcher.submit([f"{i}-x", f"{i}-y"], [3, 4])) for i in range(5)]
        await until(lambda: len(batcher.queue) == 10)
        model.hold.set()
        answers = await asyncio.gather(first, *others)
        await batcher.close()
        return answers

    answers = run(scenario())
    assert answers[0] == ["answer to a"]
    assert answers[1:] == [[f"answer to {i}-x", f"answer to {i}-y"] for i in range(5)]
    assert model.batches[1] == [p for i in range(5) for p in (f"{i}-x", f"{i}-y")]  # all ten in one forward pass


def test_the_token_budget_splits_the_queue():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, max_batch_tokens=100)
        model.hold.clear()
        blocker = asyncio.create_task(batcher.submit(["blocker"], [1]))
        await until(lambda: len(model.batches) == 1)
        queued = [asyncio.create_task(batcher.submit([f"t{i}"], [30])) for i in range(5)]
        await until(lambda: len(batcher.queue) == 5)
        model.hold.set()
        await asyncio.gather(blocker, *queued)
        await batcher.close()

    run(scenario())
    assert [len(batch) for batch in model.batches] == [1, 3, 2]  # 3 x 30 = 90 <= 100 < 4 x 30


def test_a_failing_input_does_not_fail_its_batch_mates():
    model = HeldModel(fail_on="poison")

    async def scenario():
        batcher = await started(model)
        model.hold.clear()
        blocker = asyncio.create_task(batcher.submit(["blocker"], [1]))
        await until(lambda: len(model.batches) == 1)
        good = asyncio.create_task(batcher.submit(["good-1", "good-2"], [2, 2]))
        bad = asyncio.create_task(batcher.submit(["poison"], [2]))
        later = asyncio.create_task(batcher.submit(["good-3"], [2]))
        await until(lambda: len(batcher.queue) == 4)
        model.hold.set()
        results = await asyncio.gather(blocker, good, bad, later, return_exceptions=True)
        await batcher.close()
        return results

    blocker, good, bad, later = run(scenario())
    assert good == ["answer to good-1", "answer to good-2"] and later == ["answer to good-3"]
    assert isinstance(bad, RuntimeError) and "poison" in str(bad)
    assert model.batches[1] == ["good-1", "good-2", "poison", "good-3"]  # tried together first, then one by one


def test_inputs_of_a_cancelled_request_never_reach_the_model():
    model = HeldModel()
    metrics = ServerMetrics()

    async def scenario():
        batcher = await started(model, metrics=metrics)
        model.hold.clear()
        blocker = asyncio.create_task(batcher.submit(["blocker"], [1]))
        await until(lambda: len(model.batches) == 1)
        gone = asyncio.create_task(batcher.submit(["gone-1", "gone-2"], [2, 2]))
        kept = asyncio.create_task(batcher.submit(["kept"], [2]))
        await until(lambda: len(batcher.queue) == 3)
        gone.cancel()  # what a client disconnect does to its request's task
        model.hold.set()
        await asyncio.gather(blocker, kept)
        await batcher.close()

    run(scenario())
    assert model.batches == [["blocker"], ["kept"]]
    assert metrics.registry.get_sample_value("bertforge_inputs_dropped_total", {"model": "test"}) == 2


def test_close_answers_everything_already_queued():
    model = HeldModel()

    async def scenario():
        batcher = await started(model)
        model.hold.clear()
        pending = [asyncio.create_task(batcher.submit([f"p{i}"], [1])) for i in range(4)]
        await until(lambda: len(model.batches) == 1)
        closing = asyncio.create_task(batcher.close())
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="shutting down"):
            await batcher.submit(["late"], [1])
        model.hold.set()
        await closing
        return await asyncio.gather(*pending)

    assert run(scenario()) == [[f"answer to p{i}"] for i in range(4)]


def test_batch_metrics_count_inputs_tokens_and_batches():
    model = HeldModel()
    metrics = ServerMetrics()

    async def scenario():
        batcher = await started(model, metrics=metrics)
        await batcher.submit(["a", "b", "c"], [4, 6, 5])
        await batcher.close()

    run(scenario())
    sample = metrics.registry.get_sample_value
    assert sample("bertforge_tokens_total", {"model": "test"}) == 15
    assert sample("bertforge_batch_size_count", {"model": "test"}) == 1
    assert sample("bertforge_batch_size_sum", {"model": "test"}) == 3
    assert sample("bertforge_batch_tokens_sum", {"model": "test"}) == 18  # 3 inputs x longest 6
    assert sample("bertforge_queue_depth", {"model": "test"}) == 0
