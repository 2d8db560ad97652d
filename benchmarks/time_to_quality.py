"""Time to quality: run a `bertforge pretrain` command and print when each held-out evaluation lands.

It starts the command, watches the run folder's metrics.jsonl, and prints for every evaluation the
seconds since start, the step and the held-out MLM accuracy; with --target it stops the run at the
first evaluation that reaches it. On a GPU it samples nvidia-smi's utilisation (the share of time a
kernel ran) twice a second and prints its mean over the training, from the first logged step on.

    python benchmarks/time_to_quality.py --run-dir DIR [--target 0.35] -- bertforge pretrain --config ... \\
        training.output_dir=DIR
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

METRIC = "eval_mlm_accuracy"


def new_records(path: Path, seen: int) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[seen:] if line.strip()]


def utilisation_sampler() -> subprocess.Popen | None:
    if shutil.which("nvidia-smi") is None:
        return None
    return subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                             "-lms", "500"], stdout=subprocess.PIPE, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run's output_dir (its metrics.jsonl)")
    parser.add_argument("--target", type=float, default=None, help="stop at the first evaluation reaching this")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    metrics = args.run_dir / "metrics.jsonl"
    start = time.perf_counter()
    run = subprocess.Popen(command)
    sampler = utilisation_sampler()
    seen, first_step_at, reached = 0, None, None
    try:
        while run.poll() is None:
            time.sleep(0.25)
            for record in new_records(metrics, seen):
                seen += 1
                now = time.perf_counter() - start
                if first_step_at is None and "loss" in record:
                    first_step_at = now
                if METRIC in record:
                    print(f"[time to quality] {now:7.1f} s  step {record['step']:>6}  {METRIC} "
                          f"{record[METRIC]:.4f}", flush=True)
                    if args.target is not None and record[METRIC] >= args.target and reached is None:
                        reached = now
                        run.terminate()
    except KeyboardInterrupt:
        run.terminate()
        run.wait()
        sys.exit("time_to_quality: interrupted; the run was stopped (its checkpoints stay in --run-dir)")
    finally:
        if run.poll() is None:
            run.terminate()
        run.wait()
    total = time.perf_counter() - start
    busy = None
    if sampler is not None:
        sampler.terminate()
        samples = [int(line) for line in sampler.communicate()[0].split() if line.strip().isdigit()]
        if first_step_at is not None:  # the samples after the first logged step: training, not set-up
            samples = samples[int(first_step_at * 2):]
        busy = statistics.mean(samples) if samples else None
    print(f"[time to quality] wall {total:.1f} s; first logged step at "
          f"{first_step_at if first_step_at is None else round(first_step_at, 1)} s; target {args.target}: "
          + (f"reached at {reached:.1f} s" if reached else "not reached")
          + (f"; GPU utilisation {busy:.0f}% (nvidia-smi, mean from the first logged step)" if busy is not None
             else ""), flush=True)
    sys.exit(0 if reached or args.target is None else 1)


if __name__ == "__main__":
    main()
