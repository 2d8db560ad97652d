"""What a CUDA trace says of a BERT-base pretraining step and of an embedding batch.

For one bf16 training step of BertForPreTraining (bertforge's masked-only head, packed, fused AdamW;
and transformers' for comparison) on real Persuasion instances at 32 x 128, and for one fp16
`Embedder.encode` of --embed-texts mixed texts with all-MiniLM-L6-v2 (CUDA graphs on and off), it
prints: the wall time, the kernels launched, the time some kernel was running (busy share), the host
gaps (idle stretches between kernels over 20 us: how many, how long together), host syncs the
trace saw, and the top kernels by GPU time. With --trace-dir it writes each Chrome trace, gzipped.

    python benchmarks/gpu_profile.py [--trace-dir DIR] [--embed-texts 256]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_inference import load_texts, minilm_dir  # noqa: E402
from bench_pretrain import load_contenders, make_batches  # noqa: E402
from device_measures import kernel_time, kernels_of, profiled_run  # noqa: E402

from bertforge import BertConfig, BertForPreTraining  # noqa: E402
from bertforge.embeddings.embed import Embedder  # noqa: E402

GAP_US = 20  # an idle stretch between kernels longer than this is the host not keeping up
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ")


def summary(label: str, profiler, wall_us: float, top: int) -> str:
    kernels = kernels_of(profiler)
    busy, gaps, gap_us = kernel_time(kernels, GAP_US)
    syncs = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CPU
                and any(e.name.startswith(name.strip()) for name in SYNC_NAMES))
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for begin, end, name in kernels:
        by_name[name][0] += 1
        by_name[name][1] += end - begin
    lines = [f"## {label}",
             f"wall {wall_us / 1e3:.2f} ms, {len(kernels)} kernels/copies, GPU busy {busy / 1e3:.2f} ms "
             f"({busy / wall_us:.0%}), {gaps} host gaps > {GAP_US} us totalling {gap_us / 1e3:.2f} ms, "
             f"{syncs} sync/blocking-copy calls",
             "| kernel | calls | GPU ms | share of busy |", "| --- | ---: | ---: | ---: |"]
    for name, (calls, us) in sorted(by_name.items(), key=lambda item: -item[1][1])[:top]:
        lines.append(f"| {name[:90]} | {calls} | {us / 1e3:.3f} | {us / busy:.1%} |")
    return "\n".join(lines)


def profiled(run, label: str, trace_dir: Path | None, top: int) -> str:
    profiler, wall_us = profiled_run(run)
    if trace_dir is not None:
        raw = trace_dir / (label.split(",")[0].replace(" ", "-") + ".json")
        profiler.export_chrome_trace(str(raw))
        with open(raw, "rb") as source, gzip.open(f"{raw}.gz", "wb") as target:
            shutil.copyfileobj(source, target)
        raw.unlink()
    return summary(label, profiler, wall_us, top)


def pretraining_step_reports(trace_dir: Path | None, top: int) -> list[str]:
    device, dtype = torch.device("cuda"), torch.bfloat16
    batches = make_batches(4, 32, 128)
    reports = []
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        BertForPreTraining(BertConfig.from_preset("base", vocab_size=30522)).save_pretrained(folder)
        contenders = load_contenders(Path(folder), device, batches, compiled=False)
        for contender in contenders:
            if contender.label not in ("bertforge, masked-only head",) and not contender.label.startswith("transf"):
                continue
            for index in range(3):  # warm-up: allocator, cuBLAS handles, optimizer state
                contender.step(index, device, dtype)
            reports.append(profiled(lambda: contender.step(3, device, dtype),
                                    f"pretraining step, BERT-base bf16 32x128, {contender.label}", trace_dir, top))
    return reports


def embed_reports(trace_dir: Path | None, top: int, count: int) -> list[str]:
    texts, reports = load_texts(count), []
    for graphs in (True, False):
        embedder = Embedder.from_pretrained(minilm_dir(), normalize=True, batch_size=32, dtype="fp16",
                                            device=torch.device("cuda"), progress=False,
                                            cuda_graphs=None if graphs else False)
        for _ in range(2):
            embedder.encode(texts)
        label = f"embed {'graphs' if graphs else 'eager'}, all-MiniLM-L6-v2 fp16, {count} texts, batch 32"
        reports.append(profiled(lambda: embedder.encode(texts), label, trace_dir, top))
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-dir", type=Path, default=None, help="write gzipped Chrome traces here")
    parser.add_argument("--embed-texts", type=int, default=256, help="texts in the profiled encode (default 256)")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per trace (default 8)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}\n")
    for report in pretraining_step_reports(args.trace_dir, args.top) + embed_reports(args.trace_dir, args.top,
                                                                                      args.embed_texts):
        print(report + "\n", flush=True)


if __name__ == "__main__":
    main()
