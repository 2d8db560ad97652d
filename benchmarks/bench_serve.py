"""The server under load: N concurrent clients against `bertforge serve`, beside direct `embed` on the same texts.

Starts `bertforge serve --model minilm` in its own process on 127.0.0.1 (a free port), embeds
the texts directly in this process first (the server idle meanwhile), then sends every text
through POST /embed under each load of --loads: CLIENTSxTEXTS is CLIENTS concurrent clients
(asyncio + httpx, one connection each) sending TEXTS texts per request (default: issue 24's
16x1 and 4x32). Prints one Markdown table: sentences/s both ways and batching efficiency =
server rate / direct rate, request latency p50/p99, errors, the server's RSS at start and its
peak, the mean batch the server formed, the share of the run its model thread was busy and its
model time per text (from its /metrics: busy near 1 with a model time per text above direct's
means the model runs slower under the server's load, not that it waits for work), and the CPU its
event loop's thread spent per request (HTTP, validation, JSON; from the kernel's per-thread counts).
The clients run on the same machine, so on a small CPU they take cycles from the server: the
efficiency is a lower bound
for clients elsewhere (`--client raw`, HTTP/1.1 written on asyncio streams, takes a fraction of
httpx's CPU per request and so comes closer to that). The server runs in its own session, as a service would: where the
kernel shares the CPU between sessions (Linux's autogroup), a loaded machine then gives the
server the share the direct run had, instead of splitting this process's share with the clients.

    python benchmarks/bench_serve.py [--n 512] [--loads 16x1 4x32] [--client httpx|raw] [--threads 0]
                                     [--device auto|cpu|cuda] [--no-cuda-graphs]

Bounded: each phase stops after --timeout seconds (an unfinished run is reported as such).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import torch

from bench_inference import load_texts, minilm_dir
from http_clients import connect

from bertforge import __version__
from bertforge.embeddings.embed import Embedder
from bertforge.engine.devices import device_from_option
from bertforge.errors import UsageError
from bertforge.resources import checkout_environment

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class ServerProcess:
    """`bertforge serve` in a child process; the base URL once it listens, its RSS sampled in a thread."""

    def __init__(self, threads: int, max_batch_tokens: int, device: str, cuda_graphs: bool):
        environment = checkout_environment(**({"OMP_NUM_THREADS": str(threads)} if threads else {}))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(minilm_dir()), "--port", "0",
             "--max-batch-tokens", str(max_batch_tokens), "--device", device,
             "--cuda-graphs" if cuda_graphs else "--no-cuda-graphs"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, cwd=PROJECT_ROOT,
            start_new_session=True)
        banner = self.process.stdout.readline()
        found = re.search(r"http://\S+:\d+", banner)
        if not found:
            self.process.kill()
            raise SystemExit(f"the server did not start: {banner}{self.process.stdout.read()}")
        self.base = found.group(0)
        self.rss = psutil.Process(self.process.pid).memory_info().rss
        self.peak_rss = self.rss
        self.sampling = True
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()

    def sample(self) -> None:
        watched = psutil.Process(self.process.pid)
        while self.sampling:
            self.peak_rss = max(self.peak_rss, watched.memory_info().rss)
            time.sleep(0.05)

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.base}/metrics").text
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    def loop_cpu_seconds(self) -> float:
        """CPU time so far of the server's main thread, which runs uvicorn's event loop (HTTP, validation, JSON)."""
        main = next(t for t in psutil.Process(self.process.pid).threads() if t.id == self.process.pid)
        return main.user_time + main.system_time

    def stop(self) -> int:
        self.sampling = False
        self.process.terminate()
        return self.process.wait(timeout=60)


async def load(base: str, texts: list[str], clients: int, per_request: int, timeout: float, client_kind: str):
    """Every text once through POST /embed; (vectors by text index, latencies, errors, seconds)."""
    requests = [list(range(i, min(i + per_request, len(texts)))) for i in range(0, len(texts), per_request)]
    vectors: dict[int, list[float]] = {}
    latencies: list[float] = []
    errors: list[str] = []
    next_request = iter(requests)

    async def client(connection):
        for indices in next_request:  # the clients share one iterator: each request is sent once
            started = time.perf_counter()
            status, body = await connection.post("/embed", {"inputs": [texts[i] for i in indices], "truncate": True})
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors.append(f"{status}: {body[:200].decode(errors='replace')}")
                continue
            vectors.update(zip(indices, json.loads(body)))

    async with contextlib.AsyncExitStack() as stack:
        connections = [await stack.enter_async_context(connect(client_kind, base, timeout)) for _ in range(clients)]
        await connections[0].post("/embed", {"inputs": texts[:8], "truncate": True})  # warm-up, as the direct run has
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(c) for c in connections)), timeout)
        seconds = time.perf_counter() - started
    return vectors, latencies, errors, seconds


def load_shape(text: str) -> tuple[int, int]:
    """'16x1' -> (16 clients, 1 text per request)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match or 0 in (int(match.group(1)), int(match.group(2))):
        raise argparse.ArgumentTypeError(f"{text!r}: write CLIENTSxTEXTS, e.g. 16x1 (both at least 1)")
    return int(match.group(1)), int(match.group(2))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="texts (real: Austen lines and paragraphs, tweets)")
    parser.add_argument("--loads", type=load_shape, nargs="+", default=[(16, 1), (4, 32)],
                        help="CLIENTSxTEXTS: concurrent clients x texts per request (default: 16x1 4x32)")
    parser.add_argument("--client", choices=["httpx", "raw"], default="httpx",
                        help="httpx (default), or raw HTTP/1.1 on asyncio streams: clients that take little CPU, "
                             "closer to clients on another machine")
    parser.add_argument("--threads", type=int, default=0, help="torch threads, both sides (0: torch's default)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per phase")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="both sides' device (auto: the GPU when torch sees one)")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="on a GPU, both sides launch every kernel from Python (default: passes replayed from "
                             "CUDA graphs)")
    args = parser.parse_args()
    try:
        device = device_from_option(args.device).type
    except UsageError as error:
        parser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    texts = load_texts(args.n)

    embedder = Embedder.from_pretrained(minilm_dir(), normalize=True, device=device,
                                        cuda_graphs=None if args.cuda_graphs else False)
    embedder.encode(texts[:32])  # warm-up

    def direct_run() -> tuple[np.ndarray, float]:
        started = time.perf_counter()
        vectors = embedder.encode(texts)
        return vectors, len(texts) / (time.perf_counter() - started)

    rows = []
    for clients, per_request in args.loads:
        # Direct runs just before and after each server run (the server process not yet started, or
        # stopped), averaged: on a shared machine the load changes during a run.
        direct, rate_before = direct_run()
        server = ServerProcess(args.threads, args.max_batch_tokens, device, args.cuda_graphs)
        try:
            loop_before = server.loop_cpu_seconds()
            vectors, latencies, errors, seconds = asyncio.run(
                load(server.base, texts, clients, per_request, args.timeout, args.client))
            loop_seconds = server.loop_cpu_seconds() - loop_before
            batches = server.metric('bertforge_batch_size_count{model="embed"}')
            batched = server.metric('bertforge_batch_size_sum{model="embed"}')
            model_seconds = server.metric('bertforge_inference_seconds_sum{model="embed"}')
        finally:
            exit_code = server.stop()
        direct_rate = (rate_before + direct_run()[1]) / 2
        served = np.array([vectors[i] for i in range(len(texts)) if i in vectors])
        difference = float(np.abs(served - direct[:len(served)]).max()) if len(vectors) == len(texts) else float("nan")
        rate = len(vectors) / seconds
        rows.append([f"{clients} x {per_request}", f"{len(vectors):,}", f"{rate:,.1f}", f"{direct_rate:,.1f}",
                     f"{rate / direct_rate:.2f}", f"{1000 * percentile(latencies, 50):,.0f}",
                     f"{1000 * percentile(latencies, 99):,.0f}", str(len(errors)),
                     f"{server.rss / 2**20:,.0f} / {server.peak_rss / 2**20:,.0f}",
                     f"{batched / max(batches, 1):.1f}", f"{model_seconds / seconds:.2f}",
                     f"{1000 * model_seconds / max(batched, 1):.2f}",
                     f"{1000 * loop_seconds / -(-len(texts) // per_request):.2f}", f"{difference:.1e}", str(exit_code)])
        for error in errors[:3]:
            print("error:", error, file=sys.stderr)

    header = ["clients x texts/request", "texts", "server texts/s", "direct embed texts/s", "efficiency",
              "p50 ms", "p99 ms", "errors", "server RSS MB start / peak", "mean batch", "model busy",
              "model ms/text", "event loop CPU ms/request", "max |server - direct|",
              "exit code (SIGTERM)"]
    print(f"bertforge {__version__} serve vs direct embed, all-MiniLM-L6-v2, {len(texts)} real texts; "
          f"{datetime.date.today()}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}"
          f"{'' if device != 'cuda' else ', CUDA graphs' if args.cuda_graphs else ', no CUDA graphs'}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"fastapi {__import__('fastapi').__version__}, uvicorn {__import__('uvicorn').__version__}; "
          f"{args.client} clients; load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
