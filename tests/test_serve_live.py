"""The server under real uvicorn on 127.0.0.1 (a free port): concurrent clients, faults, SIGTERM.

Bounded by request counts and timeouts: each test stops by itself within a minute.
"""
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("uvicorn")
import httpx  # noqa: E402
import psutil  # noqa: E402

from bertforge.embeddings.embed import Embedder  # noqa: E402
from bertforge.resources import checkout_environment  # noqa: E402
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.background import serving  # noqa: E402
from bertforge.serve.models import load_models  # noqa: E402
from bertforge.serve.settings import ServeSettings  # noqa: E402
from serve_support import review_sentences  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def models(minilm_dir):
    return load_models(str(minilm_dir))


@pytest.fixture(scope="module")
def sentences(data_dir):
    return review_sentences(data_dir, 128)


@pytest.fixture(scope="module")
def long_texts(sentences):
    """16 texts of about 130 tokens: a forward pass of them takes a noticeable while on a CPU."""
    words = " ".join(sentences).split()
    return [" ".join(words[i * 7:i * 7 + 100]) for i in range(16)]


def metric(base: str, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (0 when absent)."""
    text = httpx.get(f"{base}/metrics", timeout=TIMEOUT).text
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, flags=re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_until(condition, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the server")
        time.sleep(0.02)


def read_response(connection: socket.socket) -> str:
    """One whole HTTP response from a raw socket: headers, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, flags=re.IGNORECASE).group(1))
    while len(body) < length:
        body += connection.recv(4096)
    return (head + b"\r\n\r\n" + body).decode()


def in_threads(functions) -> list:
    """Run the callables at the same moment (a barrier), each in its own thread; their results in order."""
    barrier = threading.Barrier(len(functions))
    results = [None] * len(functions)

    def call(i, function):
        barrier.wait()
        try:
            results[i] = function()
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[i] = error

    threads = [threading.Thread(target=call, args=(i, f)) for i, f in enumerate(functions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    return results


def test_thirty_two_concurrent_clients_each_get_their_own_vectors(models, sentences, minilm_dir):
    expected = Embedder.from_pretrained(minilm_dir, normalize=True).encode(sentences)
    rss_before = psutil.Process().memory_info().rss
    with serving(create_app(models)) as base:

        def client(number: int):
            answers = []
            with httpx.Client(base_url=base, timeout=TIMEOUT) as http:
                for request in range(2):  # 32 clients x 2 requests x 2 texts = 128 texts, each once
                    first = (number * 2 + request) * 2
                    response = http.post("/embed", json={"inputs": sentences[first:first + 2]})
                    answers.append((first, response.status_code, response.json()))
            return answers

        results = in_threads([lambda n=n: client(n) for n in range(32)])
        batches = metric(base, "bertforge_batch_size_count", '{model="embed"}')
    answers = [answer for result in results for answer in result]
    assert len(answers) == 64 and all(status == 200 for _, status, _ in answers)
    for first, _, vectors in answers:
        np.testing.assert_allclose(vectors, expected[first:first + 2], atol=1e-5)
    assert batches < 64  # concurrent requests shared forward passes
    assert psutil.Process().memory_info().rss - rss_before < 400 * 2**20


def test_a_request_that_fails_in_the_model_does_not_fail_the_others(models, sentences, minilm_dir, monkeypatch):
    expected = Embedder.from_pretrained(minilm_dir, normalize=True).encode(sentences[:4])
    poison = models.embedding.tokenizer.convert_tokens_to_ids("zebra")
    pooled = models.embedding.pooled

    def fails_on_zebra(inputs):
        if any(poison in item.ids for item in inputs):
            raise RuntimeError("the model cannot take zebras")
        return pooled(inputs)

    monkeypatch.setattr(models.embedding, "pooled", fails_on_zebra)
    with serving(create_app(models)) as base:
        bodies = [sentences[:2], ["a zebra crossed the road"], sentences[2:4]]
        responses = in_threads([lambda b=b: httpx.post(f"{base}/embed", json={"inputs": b}, timeout=TIMEOUT)
                                for b in bodies])
    assert [r.status_code for r in responses] == [200, 424, 200]
    assert "cannot take zebras" in responses[1].json()["error"] and responses[1].json()["error_type"] == "backend"
    np.testing.assert_allclose(responses[0].json() + responses[2].json(), expected, atol=1e-5)


def test_a_burst_over_the_concurrency_limit_gets_429_and_the_server_recovers(models, long_texts):
    with serving(create_app(models, ServeSettings(max_concurrent_requests=2))) as base:
        def request():
            return httpx.post(f"{base}/embed", json={"inputs": long_texts}, timeout=TIMEOUT)

        responses = in_threads([request] * 8)
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 2 and statuses.count(429) >= 1
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.json()["error_type"] == "overloaded" and "--max-concurrent-requests" in refused.json()["error"]
        assert refused.headers["retry-after"] == "1"
        assert metric(base, "bertforge_requests_rejected_total") == statuses.count(429)
        assert httpx.post(f"{base}/embed", json={"inputs": "after the burst"}, timeout=TIMEOUT).status_code == 200


def test_a_stalled_upload_gets_408_while_others_are_served(models):
    with serving(create_app(models, ServeSettings(body_timeout_seconds=2.0))) as base:
        assert httpx.post(f"{base}/embed", json={"inputs": "warm-up"}, timeout=TIMEOUT).status_code == 200
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as stalled:
            stalled.sendall(b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"inputs\": ")  # then nothing more
            started = time.monotonic()
            assert httpx.post(f"{base}/embed", json={"inputs": "meanwhile"}, timeout=TIMEOUT).status_code == 200
            assert time.monotonic() - started < 2.0  # answered before the stalled upload's deadline
            answer = read_response(stalled)
        assert answer.startswith("HTTP/1.1 408") and "did not arrive within 2 s" in answer
        assert httpx.post(f"{base}/embed", json={"inputs": "after"}, timeout=TIMEOUT).status_code == 200


def test_a_client_that_disconnects_is_dropped_from_the_queue(models, long_texts, monkeypatch):
    import json

    gate, pooled = threading.Event(), models.embedding.pooled

    def held_pooled(inputs):  # the model thread waits until the test has queued and left
        gate.wait(TIMEOUT)
        return pooled(inputs)

    monkeypatch.setattr(models.embedding, "pooled", held_pooled)
    with serving(create_app(models)) as base:
        blocker = threading.Thread(target=lambda: httpx.post(f"{base}/embed", json={"inputs": long_texts},
                                                             timeout=TIMEOUT))
        blocker.start()
        wait_until(lambda: metric(base, "bertforge_requests_in_flight") == 1)
        host, port = base.removeprefix("http://").split(":")
        body = json.dumps({"inputs": long_texts[::-1]}).encode()
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as leaving:
            leaving.sendall(b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: metric(base, "bertforge_queue_depth", '{model="embed"}') == 16)
        # The socket is closed: the server notices, answers 499 to no one, and drops the 16 queued inputs.
        wait_until(lambda: metric(base, "bertforge_requests_total", '{route="/embed",status="499"}') == 1)
        gate.set()
        blocker.join(TIMEOUT)
        assert metric(base, "bertforge_inputs_dropped_total", '{model="embed"}') == 16
        assert metric(base, "bertforge_requests_total", '{route="/embed",status="200"}') == 1
        assert httpx.post(f"{base}/embed", json={"inputs": "still serving"}, timeout=TIMEOUT).status_code == 200


def test_sigterm_finishes_queued_requests_and_exits_zero(minilm_dir, long_texts):
    environment = checkout_environment(OMP_NUM_THREADS="1")
    process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "serve", "--model", str(minilm_dir),
                                "--port", "0", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=environment, cwd=PROJECT_ROOT)
    try:
        banner = process.stdout.readline()
        assert "1 thread)" in banner  # --threads, and the figure said at start
        base = re.search(r"http://\S+:\d+", banner).group(0)
        assert base.startswith("http://127.0.0.1:")  # loopback unless told otherwise

        texts = long_texts * 2  # 32 texts of ~130 tokens a request: in flight long enough to be caught

        def request(reverse: bool):
            return httpx.post(f"{base}/embed", json={"inputs": texts[::-1] if reverse else texts}, timeout=TIMEOUT)

        results = []
        clients = [threading.Thread(target=lambda r=i % 2: results.append(request(bool(r)))) for i in range(3)]
        for thread in clients:
            thread.start()
        wait_until(lambda: metric(base, "bertforge_requests_in_flight") == 3)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no new connections once the signal has arrived
            httpx.get(f"{base}/health", timeout=5)
        for thread in clients:
            thread.join(TIMEOUT)
        assert [r.status_code for r in results] == [200] * 3
        assert all(len(r.json()) == 32 for r in results)
        assert process.wait(timeout=TIMEOUT) == 0
        assert "stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


USAGE, FAILED = 2, 1  # the CLI's exit codes: the command line is wrong / a file, a model or the run failed


@pytest.mark.parametrize("arguments, message, code", [
    (["--port", "70000"], "--port: must be at most 65535, got 70000", USAGE),
    (["--host", "no-such-host.invalid"], "--host 'no-such-host.invalid' is not an address", USAGE),
    (["--model", "/no/such/folder"], "--model /no/such/folder: no config.json there", FAILED),
    (["--pooling", "sum"], "argument --pooling: invalid choice: 'sum'", USAGE),
    (["--max-batch-tokens", "100"], "--max-batch-tokens 100 is smaller than the longest input, 256 tokens", USAGE),
    (["--index", "/no/such/index"], "--index /no/such/index is not a folder", FAILED),
    (["--vocab", "/no/such/vocab.txt"], "--vocab /no/such/vocab.txt does not exist", FAILED),
    (["--mlm", "minilm"], "--mlm minilm holds a BertModel model without MLM head weights", FAILED),
    (["--device", "tpu"], "--device 'tpu' is not a device", USAGE),
    (["--dtype", "int4"], "argument --dtype: invalid choice: 'int4'", USAGE),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "--device cuda: torch sees no GPU here", USAGE)]))
def test_cli_mistakes_are_one_line(arguments, message, code, capsys, minilm_dir):
    from bertforge.cli.parser import main

    assert main(["serve", "--model", str(minilm_dir), "--port", "0", *arguments]) == code
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and "Traceback" not in error


def test_cli_refuses_a_classifier_that_is_not_one(capsys, minilm_dir):
    from bertforge.cli.parser import main

    assert main(["serve", "--port", "0", "--classifier", str(minilm_dir)]) == FAILED
    assert "holds a BertModel model; give a fine-tuned BertForSequenceClassification folder" in capsys.readouterr().err


def test_cli_says_when_the_port_is_taken(capsys):
    from bertforge.cli.parser import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == FAILED
    assert f"port {port} on 127.0.0.1 is in use; pick another with --port" in capsys.readouterr().err
