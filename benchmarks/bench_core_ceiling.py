"""What N cores can give one embedding job: N separate one-thread processes at once, beside our N-thread encode.

    python benchmarks/bench_core_ceiling.py [--n 1000] [--cores 2] [--repeats 3] [--dtype float32]

A long CPU encode runs a batch per core (engine/workers.py). The most N cores can do for that design is N
processes that share nothing, each encoding on one thread (no GIL, no shared tokenizer thread, no result
copies): their summed texts/s is the ceiling, lower than N times one quiet core wherever the cores share a
cache, memory bandwidth or a power budget. Printed side by side, in one run: one process alone at one thread,
the N processes at once (each and summed), and our encode at N threads in one process, with the ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertforge.engine.threads import spin_briefly, usable_threads  # noqa: E402 (imports no torch)

spin_briefly()  # before torch: OpenMP as `bertforge` commands start it
import torch  # noqa: E402

from bench_inference import device_name, load_texts, minilm_dir  # noqa: E402

import bertforge  # noqa: E402
from bertforge.embeddings.embed import Embedder  # noqa: E402


def encode_rates(threads: int, n: int, repeats: int, dtype: str, start_at: float | None = None) -> list[float]:
    """texts/s of `repeats` encodes of n texts at `threads` threads (after a warm-up), in this process. With
    start_at (a time.time()), the timed encodes begin then: processes started one after another run together."""
    torch.set_num_threads(threads)
    texts = load_texts(n)
    embedder = Embedder.from_pretrained(minilm_dir(), normalize=True, batch_size=32, dtype=dtype, progress=False)
    embedder.encode(texts[:64])
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    rates = []
    for _ in range(repeats):
        torch.set_num_threads(threads)
        started = time.perf_counter()
        embedder.encode(texts)
        rates.append(n / (time.perf_counter() - started))
    return rates


def processes_at_once(cores: int, n: int, repeats: int, dtype: str) -> list[list[float]]:
    """Each of `cores` one-thread processes' rates, their timed encodes starting together."""
    start_at = time.time() + 20  # after every process has loaded the model and warmed up
    command = [sys.executable, __file__, "--worker", "--n", str(n), "--repeats", str(repeats), "--dtype", dtype,
               "--start-at", str(start_at)]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(cores)]
    return [json.loads(child.communicate()[0].strip().splitlines()[-1]) for child in children]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="texts per encode (default 1000)")
    parser.add_argument("--cores", type=int, default=2, help="processes, and our thread count (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed encodes, median reported (default 3)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "int8"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(encode_rates(1, args.n, args.repeats, args.dtype, args.start_at)))
        return
    alone = statistics.median(encode_rates(1, args.n, args.repeats, args.dtype))
    each = [statistics.median(rates) for rates in processes_at_once(args.cores, args.n, args.repeats, args.dtype)]
    ours = statistics.median(encode_rates(args.cores, args.n, args.repeats, args.dtype))
    ceiling = sum(each)
    print(f"all-MiniLM-L6-v2 {args.dtype}, {args.n} mixed texts, batch 32; {device_name(torch.device('cpu'))}; "
          f"{usable_threads()} usable cores; bertforge {bertforge.__version__}, torch {torch.__version__}; "
          f"{datetime.now():%Y-%m-%dT%H:%M}; median of {args.repeats}\n")
    print("| run | texts/s | share of the ceiling |\n| --- | --- | --- |")
    print(f"| 1 process, 1 thread, alone | {alone:.1f} | |")
    print(f"| {args.cores} processes of 1 thread at once (each) | {' / '.join(f'{r:.1f}' for r in each)} | |")
    print(f"| {args.cores} processes at once, summed: the ceiling | {ceiling:.1f} "
          f"({ceiling / alone:.2f}x alone) | 100% |")
    print(f"| bertforge, {args.cores} threads in one process | {ours:.1f} ({ours / alone:.2f}x alone) "
          f"| {100 * ours / ceiling:.0f}% |")


if __name__ == "__main__":
    main()
