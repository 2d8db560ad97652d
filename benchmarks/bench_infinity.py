"""bertforge serve against infinity-emb on the same model, threads and load (issue 24, item 5).

Starts each server in turn on 127.0.0.1 (a free port): `bertforge serve --model FOLDER --threads T`
and `infinity_emb v2 --model-id FOLDER --engine torch` with OMP_NUM_THREADS=T, both on --device
(the GPU when torch sees one, else the CPU) and in --dtype's number format. Both
are driven through their OpenAI-shaped route (`/v1/embeddings`, infinity's `/embeddings`) with the
same bounded loads over the same real texts: 16 clients sending one text a request, and 4
clients sending 32; each load is run once to warm up, then timed. Each server's vectors are
checked against sentence-transformers on the same folder (min cosine). Prints one Markdown table:
texts/s, p50 / p99 request latency, errors, min cosine, and bertforge's ratio to infinity.

infinity-emb is installed by this script into its own virtual environment (--venv), which sees
this environment's packages (so torch stays this machine's CPU build: pinned to its version) and
puts infinity's own pins (transformers 4.x, sentence-transformers 3.x) in front of them; or
--infinity-python names an interpreter that already imports infinity_emb (a machine without the
package index, given infinity's wheels).

    python benchmarks/bench_infinity.py [--n 1000] [--threads 1] [--device auto|cpu|cuda] [--dtype fp32|fp16]
                                        [--client httpx|raw]
                                        [--venv ~/.cache/bertforge/infinity-venv | --infinity-python PYTHON]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch

from bench_inference import load_texts, minilm_dir
from http_clients import connect

from bertforge import __version__
from bertforge.engine.devices import device_from_option
from bertforge.errors import UsageError
from bertforge.resources import checkout_environment

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOADS = ((16, 1), (4, 32))  # (clients, texts per request)
START_TIMEOUT = 300.0


INFINITY_DTYPES = {"fp32": "float32", "fp16": "float16"}  # bertforge's --dtype names -> infinity's


def infinity_python(venv: Path) -> Path:
    """The venv's interpreter, with infinity-emb installed there first when missing (torch pinned to this
    environment's)."""
    python = venv / "bin" / "python"
    if (venv / "bin" / "infinity_emb").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints),
                    "infinity-emb[torch,server]"], check=True)
    return python


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    name: str
    command: list[str]
    route: str
    environment: dict

    def start(self) -> tuple[subprocess.Popen, str]:
        # Its output goes to a file, read back only to say why it did not start (a pipe left unread would fill).
        self.log = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                   env=self.environment, cwd=PROJECT_ROOT)
        base = f"http://127.0.0.1:{self.command[self.command.index('--port') + 1]}"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.log.seek(0)
                last_lines = "".join(self.log.readlines()[-15:])
                raise SystemExit(f"{self.name} exited with {process.returncode} before it served:\n{last_lines}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    return process, base
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        process.kill()
        raise SystemExit(f"{self.name} did not answer /health within {START_TIMEOUT:g} s")


def servers(folder: Path, threads: int, device: str, dtype: str, python: Path) -> list[Server]:
    environment = checkout_environment(OMP_NUM_THREADS=str(threads), DO_NOT_TRACK="1",
                                       INFINITY_ANONYMOUS_USAGE_STATS="0", HF_HUB_OFFLINE="1")
    # --auto-truncate: infinity cuts texts past the model's 256 tokens silently; bertforge, as TEI, answers
    # 413 unless asked to cut (a tenth of the Persuasion paragraphs are longer).
    bertforge = [sys.executable, "-m", "bertforge.cli", "serve", "--model", str(folder), "--threads", str(threads),
                 "--device", device, "--dtype", dtype, "--auto-truncate", "--port", str(free_port())]
    infinity = [str(python), "-m", "infinity_emb.cli", "v2", "--model-id", str(folder), "--engine", "torch",
                "--device", device, "--dtype", INFINITY_DTYPES[dtype], "--host", "127.0.0.1", "--port", str(free_port())]
    return [Server("bertforge", bertforge, "/v1/embeddings", environment),
            Server("infinity", infinity, "/embeddings", environment)]


async def drive(base: str, route: str, model: str, texts: list[str], clients: int, per_request: int, client: str):
    """Every text once, `per_request` a request, from `clients` concurrent clients; (seconds, latencies, errors, vectors)."""
    requests = iter([list(range(i, min(i + per_request, len(texts)))) for i in range(0, len(texts), per_request)])
    vectors: list = [None] * len(texts)
    latencies, errors = [], 0

    async def one_client(connection):
        nonlocal errors
        for rows in requests:  # the clients share one iterator: each request is sent once
            started = time.perf_counter()
            try:
                status, body = await connection.post(route, {"model": model, "input": [texts[r] for r in rows]})
                if status != 200:
                    raise ValueError(status)
                for row, item in zip(rows, json.loads(body)["data"]):
                    vectors[row] = item["embedding"]
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, KeyError, ValueError):
                errors += 1
            latencies.append(time.perf_counter() - started)

    async with contextlib.AsyncExitStack() as stack:
        connections = [await stack.enter_async_context(connect(client, base, 300)) for _ in range(clients)]
        started = time.perf_counter()
        await asyncio.gather(*(one_client(c) for c in connections))
        seconds = time.perf_counter() - started
    return seconds, latencies, errors, vectors


def min_cosine(vectors: list, expected: np.ndarray) -> float:
    rows = [i for i, v in enumerate(vectors) if v is not None]
    if not rows:
        return float("nan")
    served = np.array([vectors[i] for i in rows], dtype=np.float64)
    served /= np.linalg.norm(served, axis=1, keepdims=True)
    return float((served * expected[rows]).sum(axis=1).min())


def measure(server: Server, folder: Path, texts: list[str], expected: np.ndarray, client: str) -> dict:
    process, base = server.start()
    results = {}
    try:
        for clients, per_request in LOADS:
            asyncio.run(drive(base, server.route, str(folder), texts[:clients * per_request * 2], clients, per_request,
                              client))
            seconds, latencies, errors, vectors = asyncio.run(drive(base, server.route, str(folder), texts, clients,
                                                                    per_request, client))
            results[(clients, per_request)] = {
                "rate": len(texts) / seconds, "p50": 1000 * np.percentile(latencies, 50),
                "p99": 1000 * np.percentile(latencies, 99), "errors": errors, "cosine": min_cosine(vectors, expected)}
    finally:
        process.terminate()
        process.wait(timeout=60)
    return results


def table(measured: dict[str, dict]) -> str:
    lines = ["| load (clients x texts/request) | server | texts/s | p50 ms | p99 ms | errors | min cosine vs ST | "
             "bertforge / infinity texts/s |", "|---|---|---|---|---|---|---|---|"]
    for load in LOADS:
        ratio = measured["bertforge"][load]["rate"] / measured["infinity"][load]["rate"]
        for name in ("bertforge", "infinity"):
            row = measured[name][load]
            lines.append(f"| {load[0]} x {load[1]} | {name} | {row['rate']:.1f} | {row['p50']:,.0f} | {row['p99']:,.0f} "
                         f"| {row['errors']} | {row['cosine']:.6f} | {f'{ratio:.2f}' if name == 'bertforge' else ''} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="real texts per load")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for each server")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="both servers' device (auto: the GPU when torch sees one)")
    parser.add_argument("--dtype", choices=sorted(INFINITY_DTYPES), default="fp32", help="both servers' number format")
    parser.add_argument("--client", choices=["httpx", "raw"], default="httpx",
                        help="httpx (default), or raw HTTP/1.1 on asyncio streams: clients that take little CPU, so "
                             "that a fast server (a GPU's) is measured rather than the clients")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "bertforge" / "infinity-venv")
    parser.add_argument("--infinity-python", type=Path, help="an interpreter that imports infinity_emb (default: "
                                                                 "--venv's, installed there when missing)")
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    try:
        device = device_from_option(args.device).type
    except UsageError as error:
        parser.error(str(error))
    if args.dtype == "fp16" and device == "cpu":
        parser.error("--dtype fp16 is for a GPU (on the CPU both servers would run fp16 kernels torch barely has)")
    python = args.infinity_python or infinity_python(args.venv)
    folder, texts = minilm_dir(), load_texts(args.n)
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts, normalize_embeddings=True)
    measured = {server.name: measure(server, folder, texts, expected, args.client)
                for server in servers(folder, args.threads, device, args.dtype, python)}
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('infinity_emb'))"],
                             capture_output=True, text=True).stdout.strip()
    where = torch.cuda.get_device_name() if device == "cuda" else f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"bertforge {__version__} serve vs infinity-emb {version} (--engine torch), all-MiniLM-L6-v2 {args.dtype}, "
          f"{len(texts)} real texts a load, {args.threads} thread(s) each, {args.client} clients; {datetime.date.today()}; "
          f"{device}: {where}, "
          f"torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} at the end\n")
    print(table(measured))


if __name__ == "__main__":
    main()
