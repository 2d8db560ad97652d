"""The server's batcher: which queued inputs form a batch, and that each caller gets its own answers."""
import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("prometheus_client")
from bertforge.serve.batching import Batcher, next_batch_size  # noqa: E402
from bertforge.serve.metrics import ServerMetrics  # noqa: E402


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


# --- passes: a batch cut by the engine's planner, each pass packed ------------------------------

def test_a_batch_runs_in_the_engines_passes_and_answers_in_its_own_order():
    """The passes are engine.batching.plan_batches' (longest first, real tokens within the budget);
    each pass carries its packing, pairs keep their segment ids, results come back in input order."""
    from bertforge.serve.passes import Tokens, run_in_passes

    passes = []

    def run(batch, extras):
        passes.append((batch.input_ids.shape, batch.packing.num_tokens, batch.token_type_ids.tolist()))
        return [(int(ids[0]), extra) for ids, extra in zip(batch.input_ids, extras)]

    inputs = [Tokens([2] * 20), Tokens([1] * 21), Tokens([3] * 200), Tokens([4] * 3, [0, 1, 1])]
    results = run_in_passes(run, inputs, pad_id=0, max_tokens=230, extras=["b", "a", "long", "pair"])
    assert results == [(2, "b"), (1, "a"), (3, "long"), (4, "pair")]
    # 200 + 21 = 221 real tokens fit 230 (padded, 2 x 200 would not); + 20 would not.
    assert [shape for shape, _, _ in passes] == [(2, 200), (2, 20)]
    assert [tokens for _, tokens, _ in passes] == [200 + 21, 20 + 3]  # only real tokens run
    assert passes[1][2][1][:3] == [0, 1, 1] and passes[1][2][0] == [0] * 20


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
        # a full batch (3 x 30) is handed to the model thread at once, to wait its turn behind the blocker
        await until(lambda: len(batcher.queue) == 2 and len(batcher.in_flight) == 2)
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


# --- gathering: a short queue after a large batch waits a moment for the rest ----------------

def test_after_a_batch_the_queue_waits_for_as_many_inputs_as_it_held():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, gather_share=1e6)  # a deadline far away: only company ends the wait
        await eight_callers_answered_in_one_batch(batcher, model)
        straggler = asyncio.create_task(batcher.submit(["straggler"], [2]))
        await asyncio.sleep(0.1)
        assert len(model.batches) == 2  # 1 request of the 8: it waits
        rest = [asyncio.create_task(batcher.submit([f"late-{i}"], [2])) for i in range(7)]
        answers = await asyncio.gather(straggler, *rest)
        await batcher.close()
        return answers

    assert run(scenario()) == [["answer to straggler"]] + [[f"answer to late-{i}"] for i in range(7)]
    assert model.batches[2] == ["straggler"] + [f"late-{i}" for i in range(7)]  # 8 callers back: one pass


async def eight_callers_answered_in_one_batch(batcher, model) -> None:
    """An opening batch (alone: nothing ran before it), then 8 one-input requests that queued meanwhile, together."""
    model.hold.clear()
    opener = asyncio.create_task(batcher.submit(["opener"], [2]))
    await until(lambda: len(model.batches) == 1)
    callers = [asyncio.create_task(batcher.submit([f"first-{i}"], [2])) for i in range(8)]
    await until(lambda: len(batcher.queue) == 8)
    model.hold.set()
    await asyncio.gather(opener, *callers)
    assert model.batches[1] == [f"first-{i}" for i in range(8)]


def test_a_request_of_many_inputs_is_one_caller():
    """A lone client sending 8 texts a request is answered by each batch and sends the next: nothing to wait for."""
    model = HeldModel()

    async def scenario():
        batcher = await started(model, gather_share=1e6)
        for request in range(3):
            await asyncio.wait_for(batcher.submit([f"r{request}-{i}" for i in range(8)], [2] * 8), timeout=2)
        await batcher.close()

    run(scenario())
    assert model.batches == [[f"r{request}-{i}" for i in range(8)] for request in range(3)]


def test_inputs_queued_while_a_batch_ran_wait_for_that_batchs_callers():
    """Clients do not split into two cohorts: what queued during a batch waits for the callers that batch answered."""
    model = GatedModel()

    async def scenario():
        batcher = await started(model, gather_share=1e6)
        opener = asyncio.create_task(batcher.submit(["opener"], [2]))
        await until(lambda: len(model.batches) == 1)
        cohort = [asyncio.create_task(batcher.submit([f"a{i}"], [2])) for i in range(3)]
        await until(lambda: len(batcher.queue) == 3)
        model.permits.release()  # the opener's batch ends; it answered one caller, so a0-a2 start at once
        await opener
        await until(lambda: len(model.batches) == 2)
        queued_meanwhile = [asyncio.create_task(batcher.submit([f"b{i}"], [2])) for i in range(3)]
        await until(lambda: len(batcher.queue) == 3)
        model.permits.release()  # a0-a2 end: b0-b2 wait for their 3 callers
        await asyncio.gather(*cohort)
        returning = [asyncio.create_task(batcher.submit([f"c{i}"], [2])) for i in range(3)]
        await until(lambda: len(model.batches) == 3)
        model.permits.release()
        await asyncio.gather(*queued_meanwhile, *returning)
        await batcher.close()

    run(scenario())
    assert model.batches == [["opener"], ["a0", "a1", "a2"], ["b0", "b1", "b2", "c0", "c1", "c2"]]


class GatedModel(HeldModel):
    """A run_batch whose every batch waits for a permit the test gives (`permits.release()`)."""

    def __init__(self):
        super().__init__()
        self.permits = threading.Semaphore(0)

    def __call__(self, payloads: list) -> list:
        self.batches.append(list(payloads))
        self.permits.acquire(timeout=10)
        return [f"answer to {p}" for p in payloads]


def test_a_queue_that_fills_a_quarter_of_the_token_budget_does_not_wait():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, gather_share=1e6)  # without the rule it would wait (1 < 8) for ever
        await eight_callers_answered_in_one_batch(batcher, model)
        answer = await batcher.submit(["long-0", "long-1", "long-2"], [200, 200, 200])  # 600 of 1,000 tokens
        await batcher.close()
        return answer

    assert run(scenario()) == [f"answer to long-{i}" for i in range(3)]
    assert model.batches[2] == ["long-0", "long-1", "long-2"]


def test_under_heavy_load_the_next_batch_is_handed_over_while_one_runs():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, max_batch_tokens=40)  # a quarter of the budget: 5 inputs of 2 tokens
        model.hold.clear()
        running = asyncio.create_task(batcher.submit(["running"], [2]))
        await until(lambda: len(model.batches) == 1)
        one = asyncio.create_task(batcher.submit(["x0"], [2]))
        await asyncio.sleep(0.05)
        handed_over_with_one = len(batcher.in_flight)  # a short queue: it waits for the running batch
        more = asyncio.create_task(batcher.submit([f"x{i}" for i in range(1, 5)], [2] * 4))
        await until(lambda: len(batcher.in_flight) == 2)  # a quarter of the budget queued: handed over
        model.hold.set()
        await asyncio.gather(running, one, more)
        await batcher.close()
        return handed_over_with_one

    assert run(scenario()) == 1
    assert model.batches == [["running"], [f"x{i}" for i in range(5)]]


def test_the_wait_ends_at_a_share_of_the_last_batchs_time():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, gather_share=1.0)
        batcher.last_callers, batcher.last_seconds = 8, 0.2  # as if a batch answering 8 requests had just taken 0.2 s
        started_at = time.perf_counter()
        answer = await batcher.submit(["alone"], [2])
        waited = time.perf_counter() - started_at
        await batcher.close()
        return answer, waited

    answer, waited = run(scenario())
    assert answer == ["answer to alone"] and model.batches == [["alone"]]
    assert 0.15 <= waited < 5


def test_a_lone_client_never_waits():
    model = HeldModel()

    async def scenario():
        batcher = await started(model, gather_share=1e6)
        for i in range(5):  # each batch held one input, so the next one starts at once
            await asyncio.wait_for(batcher.submit([f"request-{i}"], [2]), timeout=2)
        await batcher.close()

    run(scenario())
    assert model.batches == [[f"request-{i}"] for i in range(5)]


# --- the interpreter's switch interval on a GPU ------------------------------------------------

@pytest.mark.parametrize("device, during", [("cuda", 0.0005), ("cpu", None)])
def test_a_server_on_a_gpu_shortens_the_switch_interval_while_it_runs_and_gives_it_back(device, during):
    """On a GPU the model thread waits on the device twice a pass and must win the lock back quickly
    (docs/serve.md); on the CPU the interpreter's default is left alone."""
    import sys
    from types import SimpleNamespace

    import torch

    from bertforge.serve.server import Server
    from bertforge.serve.settings import ServeSettings

    embedding = SimpleNamespace(name="stub", tokenizer=None, max_length=512, folder=None,
                                embedder=SimpleNamespace(device=torch.device(device)),
                                pooled=lambda payloads: payloads, token_states=lambda payloads: payloads)
    models = SimpleNamespace(embedding=embedding, masked_lm=None, classifier=None, reranker=None, prompts={},
                             default_prompt_name=None)
    before = sys.getswitchinterval()

    async def run_and_stop():
        server = Server(models, ServeSettings(threads=1).checked(512))
        server.start()
        seen = sys.getswitchinterval()
        await server.stop()
        return seen

    seen = asyncio.run(run_and_stop())
    assert seen == pytest.approx(during if during is not None else before)
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize("buckets, said", [(None, ""), ({(1, 8): None, (2, 8): None}, ", 2 CUDA graphs")])
def test_the_start_line_says_how_many_cuda_graphs_were_captured(buckets, said):
    import socket
    from types import SimpleNamespace

    from bertforge.serve.commands import banner

    graphs = None if buckets is None else SimpleNamespace(buckets=buckets)
    embedder = SimpleNamespace(device=SimpleNamespace(type="cuda" if buckets else "cpu"), graphs=graphs)
    server = SimpleNamespace(models=SimpleNamespace(embedding=SimpleNamespace(name="minilm", embedder=embedder)),
                             threads=4, governor=None)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        line = banner(SimpleNamespace(state=SimpleNamespace(server=server)), listening, "fp16")
    assert f"minilm ({embedder.device.type}, fp16, 4 threads{said}) on http://127.0.0.1:" in line


# --- the concurrency limit: model routes only, refused before the body is read ------------------

def test_the_concurrency_limit_refuses_model_requests_past_it_and_lets_the_rest_pass():
    from bertforge.serve.guards import ConcurrencyLimitMiddleware

    metrics = ServerMetrics()
    release = asyncio.Event()

    async def app(scope, receive, send):  # a model route that answers when released
        if (scope["method"], scope["path"]) == ("POST", "/embed"):
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limited = ConcurrencyLimitMiddleware(app, limit=1, metrics=metrics,
                                         limited={("POST", "/embed"), ("POST", "/v1/embeddings")})

    async def call(method, path):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await limited({"type": "http", "method": method, "path": path}, receive, send)
        start = sent[0]
        return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

    async def scenario():
        first = asyncio.create_task(call("POST", "/embed"))
        await until(lambda: limited.active == 1)
        refused = await call("POST", "/embed")
        refused_openai = await call("POST", "/v1/embeddings")  # OpenAI's route: OpenAI's error shape
        health = await call("GET", "/health")  # not a model route: never counted
        page = await call("GET", "/embed")  # another method on the same path is another route
        release.set()
        return await first, refused, refused_openai, health, page

    first, refused, refused_openai, health, page = run(scenario())
    assert first[0] == 200 and health[0] == 200 and page[0] == 200
    status, headers, body = refused
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert json.loads(body)["error_type"] == "overloaded" and "--max-concurrent-requests" in json.loads(body)["error"]
    status, headers, body = refused_openai
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert json.loads(body)["error"]["type"] == "overloaded" and json.loads(body)["error"]["code"] == 429
    sample = metrics.registry.get_sample_value
    assert sample("bertforge_requests_rejected_total") == 2 and sample("bertforge_requests_in_flight") == 0
    assert limited.active == 0
