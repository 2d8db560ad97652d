"""bertforge's CPU engine against the CPU runtimes people deploy, side by side in one run.

Engines, all on all-MiniLM-L6-v2 and the same real texts (bench_inference.load_texts), each
giving L2-normalised mean-pooled sentence vectors:
  - SentenceTransformer fp32 (the yardstick: ratios and cosines are taken against it);
  - bertforge Embedder fp32 and int8;
  - ONNX Runtime on bertforge's own export: plain, BERT-fused by onnxruntime.transformers.optimizer,
    and fused + quantize_dynamic int8 (what optimum / fastembed users get), in length-sorted batches
    with pooling in numpy as fastembed does;
  - CTranslate2's BERT encoder, fp32 and int8, converted with its own TransformersConverter.
Beside texts/s: the ratio of ours (fp32, or int8 for the int8 rows) to the engine, the lowest cosine
to SentenceTransformer fp32 over all texts, and useful GFLOP/s (real tokens, encoder matmuls) as a
share of the machine's matmul peak, measured on the spot with a large fp32 GEMM and an int8 GEMM
(the kernel our int8 uses here: oneDNN where the CPU has VNNI, FBGEMM on AVX2) at the same thread
count, not read from a datasheet. With --long, also the rate of our linear layers alone (timed by
hooks around each one) against the same peaks.
`--contention` adds rows run while a competing process spins on one core (started and stopped here).
Ours also runs as `bertforge` commands do without --threads: the thread count chosen batch by batch
(engine/governor.py), the "threads chosen" rows. OpenMP starts as those commands start it: a short spin
before a waiting thread sleeps (GOMP_SPINCOUNT=10000) unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.

Peers that are not test dependencies (ctranslate2) are installed into benchmarks/.peers with
`pip install --target`, so the project's own environment stays as it is.

    python benchmarks/bench_cpu_peers.py [--n 1000] [--batch-size 32] [--threads 1,2] [--repeats 3]
                                         [--long] [--contention] [--engines st,ours,ort,ct2] [--isa avx2]
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bertforge.engine.threads import spin_briefly  # noqa: E402 (imports no torch)

spin_briefly()  # before torch: OpenMP as `bertforge` commands start it (a short spin; OMP_WAIT_POLICY wins)

# --isa avx2: an AVX2 machine stood in for on a newer x86 CPU. The libraries read these before their first use,
# so the bench starts itself again with them set. ONNX Runtime has no such switch: its rows keep the CPU's own ISA.
AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2", "CT2_FORCE_CPU_ISA": "AVX2"}
wants_avx2 = "--isa=avx2" in sys.argv or any(a == "--isa" and sys.argv[i + 1:i + 2] == ["avx2"]
                                             for i, a in enumerate(sys.argv))
if wants_avx2 and any(os.environ.get(k) != v for k, v in AVX2_ONLY.items()):
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ONLY})

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
PEERS = HERE / ".peers"  # pip --target folder for peers outside the test extras; git-ignored
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PEERS))

import bertforge  # noqa: E402
from bench_inference import MAX_LENGTH, device_name, load_texts, minilm_dir  # noqa: E402
from bertforge.embeddings.embed import Embedder  # noqa: E402
from bertforge.engine.threads import usable_threads  # noqa: E402
from bertforge.input_files import open_text  # noqa: E402
from bertforge.resources import demo_data  # noqa: E402
from device_measures import encoder_flops  # noqa: E402

CT2_VERSION = "4.8.5"


def ensure_ctranslate2():
    """Import ctranslate2, installing it into benchmarks/.peers first when it is missing."""
    try:
        import ctranslate2
    except ImportError:
        print(f"installing ctranslate2=={CT2_VERSION} into {PEERS} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(PEERS),
                        f"ctranslate2=={CT2_VERSION}"], check=True)
        importlib.invalidate_caches()  # .peers was on sys.path before the package was in it: a stale finder cache
        import ctranslate2
    return ctranslate2


def long_texts(n: int) -> list[str]:
    """n Persuasion paragraphs of 150+ words: inputs near the model's 256-token limit."""
    with open_text(demo_data("austen/persuasion.txt")) as file:
        paragraphs = [" ".join(block.split()) for block in file.read().split("\n\n")]
    long = [p for p in paragraphs if len(p.split()) >= 150]
    return (long * (n // len(long) + 1))[:n]


# ---- measured peaks -------------------------------------------------------------------------

def fp32_gemm_gflops(threads: int, size: int = 2048, seconds: float = 1.0) -> float:
    """Best GFLOP/s of a (size x size) @ (size x size) float32 matmul at this thread count."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    return best_rate(lambda: torch.mm(a, b), 2 * size ** 3, seconds)


def int8_gemm_gflops(threads: int, tokens: int = 4096, width: int = 1536, seconds: float = 1.0) -> tuple[float, str]:
    """(best GOP/s, kernel) of the int8 product our Int8Linear runs on this CPU (`int8_kernel`), on activations on
    that kernel's grid (`quantize_per_token`: int8, uint8 for oneDNN on VNNI alone, float rows FBGEMM quantises)."""
    from bertforge.engine.precision import GRIDS, Int8Linear, quantize_per_token

    torch.set_num_threads(threads)
    linear = Int8Linear(torch.nn.Linear(width, width, bias=False))
    rows, _, _ = quantize_per_token(torch.randn(tokens, width).clamp_(-5, 5), grid=GRIDS.get(linear.kernel, "int8"))
    return best_rate(lambda: linear.int8_product(rows), 2 * tokens * width * width, seconds), linear.kernel


def best_rate(run, operations: float, seconds: float) -> float:
    run()
    best, spent = float("inf"), 0.0
    while spent < seconds:
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best, spent = min(best, elapsed), spent + elapsed
    return operations / best / 1e9


# ---- engines: each a function texts -> (n, dim) normalised vectors ---------------------------

def normalised(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)


def length_sorted_batches(id_lists: list[list[int]], batch_size: int):
    order = sorted(range(len(id_lists)), key=lambda i: len(id_lists[i]))
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


def onnx_engine(model_file: Path, tokenizer, threads: int, batch_size: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def encode(texts: list[str]) -> np.ndarray:
        ids = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        vectors = np.zeros((len(texts), 0), dtype=np.float32)
        for rows in length_sorted_batches(ids, batch_size):
            width = max(len(ids[i]) for i in rows)
            input_ids = np.array([ids[i] + [0] * (width - len(ids[i])) for i in rows], dtype=np.int64)
            mask = (input_ids != 0).astype(np.int64)
            mask[:, 0] = 1
            feeds = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
            hidden = session.run(None, {k: v for k, v in feeds.items() if k in names})[0]  # (batch, seq, dim)
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            if vectors.shape[1] == 0:
                vectors = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            vectors[rows] = pooled
        return normalised(vectors)
    return encode


class Ct2Engine:
    """CTranslate2's encoder, loaded only for its turn (`open` / `close`, outside the timing).

    A live ctranslate2.Encoder slows torch in the same process even while it is idle: our int8 at 2
    threads ran 246-257 texts/s beside one against 396-407 before it was made and after it was deleted
    (2026-11-26, this machine), and the fp32 rows lost as much. Loaded for its own turn only, it takes
    nothing from the engines timed before and after it.
    """

    def __init__(self, model_dir: Path, tokenizer, threads: int, batch_size: int, compute_type: str):
        self.ctranslate2 = ensure_ctranslate2()
        self.model_dir, self.tokenizer, self.threads = model_dir, tokenizer, threads
        self.batch_size, self.compute_type = batch_size, compute_type
        self.encoder = None

    def open(self) -> None:
        self.encoder = self.ctranslate2.Encoder(str(self.model_dir), device="cpu", compute_type=self.compute_type,
                                                intra_threads=self.threads)

    def close(self) -> None:
        self.encoder = None

    def __call__(self, texts: list[str]) -> np.ndarray:
        ids = self.tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        vectors = None
        for rows in length_sorted_batches(ids, self.batch_size):
            output = self.encoder.forward_batch([ids[i] for i in rows])
            hidden = np.array(output.last_hidden_state)  # (batch, seq, dim), padded past each length
            lengths = np.array([len(ids[i]) for i in rows])
            mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
            pooled = (hidden * mask[..., None]).sum(1) / lengths[:, None]
            if vectors is None:
                vectors = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            vectors[rows] = pooled
        return normalised(vectors)


def build_peer_models(folder: Path, work: Path) -> dict[str, Path]:
    """The ONNX files (plain, fused, fused int8) and the CTranslate2 model, made once into `work`."""
    paths = {"onnx": work / "onnx" / "model.onnx", "onnx-fused": work / "onnx-fused.onnx",
             "onnx-fused-int8": work / "onnx-fused-int8.onnx", "ct2": work / "ct2"}
    if not paths["onnx"].exists():
        subprocess.run([sys.executable, "-m", "bertforge.cli", "export", "onnx", str(folder), str(work / "onnx")],
                       check=True)
    if not paths["onnx-fused"].exists():
        from onnxruntime.transformers.optimizer import optimize_model

        config = bertforge.BertConfig.from_json_file(folder / "config.json")
        optimize_model(str(paths["onnx"]), model_type="bert", num_heads=config.num_attention_heads,
                       hidden_size=config.hidden_size).save_model_to_file(str(paths["onnx-fused"]))
    if not paths["onnx-fused-int8"].exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(paths["onnx-fused"]), str(paths["onnx-fused-int8"]), weight_type=QuantType.QInt8)
    if not paths["ct2"].exists():
        ctranslate2 = ensure_ctranslate2()
        ctranslate2.converters.TransformersConverter(str(folder)).convert(str(paths["ct2"]))
    return paths


def linear_layer_gflops(embedder: Embedder, texts: list[str]) -> float:
    """GFLOP/s (GOP/s for int8) of the model's linear layers alone over one encode of texts, each call timed by hooks."""
    from bertforge.engine.precision import Int8Linear

    started, totals = {}, {"seconds": 0.0, "flops": 0.0}

    def before(module, inputs):
        started[module] = time.perf_counter()

    def after(module, inputs, output):
        totals["seconds"] += time.perf_counter() - started[module]
        totals["flops"] += 2 * output.numel() * module.in_features

    linears = [m for m in embedder.model.modules() if isinstance(m, (torch.nn.Linear, Int8Linear))]
    hooks = [hook for m in linears for hook in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        embedder.encode(texts)
    finally:
        for hook in hooks:
            hook.remove()
    return totals["flops"] / totals["seconds"] / 1e9


def print_linear_layer_rates(folder: Path, texts: list[str], batch_size: int, peaks: tuple[float, float]) -> None:
    print("\nour linear layers alone on these texts (hooks around each call):")
    for dtype in ("fp32", "int8"):
        embedder = Embedder.from_pretrained(folder, pooling="mean", normalize=True, batch_size=batch_size,
                                            dtype=dtype, progress=False)
        embedder.encode(texts[:batch_size])  # warm-up
        rate = linear_layer_gflops(embedder, texts)
        share = f"{rate / peaks[0]:.0%} of the fp32 peak" + (f", {rate / peaks[1]:.0%} of the int8 peak"
                                                             if dtype == "int8" else "")
        print(f"  bertforge {dtype}: {rate:,.1f} G{'OP' if dtype == 'int8' else 'FLOP'}/s ({share})", flush=True)


# ---- the run ---------------------------------------------------------------------------------

# Spins until its parent is gone: a bench stopped by a signal (kill, a timeout), which runs no `finally`, must not
# leave a core busy behind it (one did, 2026-11-26, and every measurement after it ran beside a spinning core).
SPINNER = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


@contextlib.contextmanager
def competing_process(core: int):
    """A process spinning on one core for the duration (a busy neighbour on a shared machine)."""
    spinner = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", SPINNER])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def time_engines(engines: dict, texts: list[str], repeats: int) -> tuple[dict, dict]:
    """Median seconds and the vectors of each engine; engines take turns within each repeat.

    An engine with `open` / `close` (Ct2Engine) is loaded for its turn only, outside the timing."""
    def turn(encode, batch):
        getattr(encode, "open", lambda: None)()
        try:
            start = time.perf_counter()
            result = encode(batch)
            return result, time.perf_counter() - start
        finally:
            getattr(encode, "close", lambda: None)()

    for encode in engines.values():
        turn(encode, texts[:32])  # warm-up: allocation, kernel choice
    seconds, vectors = {name: [] for name in engines}, {}
    for _ in range(repeats):
        for name, encode in engines.items():
            vectors[name], elapsed = turn(encode, texts)
            seconds[name].append(elapsed)
    return {name: statistics.median(times) for name, times in seconds.items()}, vectors


def engines_at(threads: int, args, folder: Path, paths: dict, tokenizer, reference) -> dict:
    torch.set_num_threads(threads)
    chosen = set(args.engines.split(","))
    engines = {}
    if "st" in chosen:
        engines["SentenceTransformer fp32"] = lambda texts: reference.encode(
            texts, batch_size=args.batch_size, normalize_embeddings=True)
    if "ours" in chosen:
        for dtype in ("fp32", "int8"):
            embedder = Embedder.from_pretrained(folder, pooling="mean", normalize=True, batch_size=args.batch_size,
                                                dtype=dtype, progress=False)
            engines[f"bertforge {dtype}"] = embedder.encode
        for dtype in ("fp32", "int8") if threads == usable_threads() else ():
            # what `bertforge embed` does without --threads: the count chosen per batch, between 1 and this
            # table's count (the usable cores), so these rows appear in that table only
            embedder = Embedder.from_pretrained(folder, pooling="mean", normalize=True, batch_size=args.batch_size,
                                                dtype=dtype, progress=False, threads="auto")
            engines[f"bertforge {dtype}, threads chosen (1-{usable_threads()})"] = embedder.encode
    if "ort" in chosen:
        for key, label in (("onnx", "ORT fp32"), ("onnx-fused", "ORT fused fp32"),
                           ("onnx-fused-int8", "ORT fused int8")):
            engines[label] = onnx_engine(paths[key], tokenizer, threads, args.batch_size)
    if "ct2" in chosen:
        for compute_type in ("float32", "int8"):
            engines[f"CTranslate2 {compute_type.replace('float32', 'fp32')}"] = Ct2Engine(
                paths["ct2"], tokenizer, threads, args.batch_size, compute_type)
    return engines


def print_table(title: str, seconds: dict, vectors: dict, truth: np.ndarray, texts: list[str], flops: float,
                peaks: tuple[float, float]) -> None:
    print(f"\n{title}\n")
    print("| engine | texts/s | ours / engine | lowest cosine to ST fp32 | useful GFLOP/s | share of measured peak |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, elapsed in seconds.items():
        ours = "bertforge int8" if "int8" in name else "bertforge fp32"
        ratio = f"{seconds[name] / seconds[ours]:.2f}x" if ours in seconds else "-"
        cosine = float((vectors[name] * truth).sum(axis=1).min())
        gflops = flops / elapsed / 1e9
        peak = peaks[1] if "int8" in name else peaks[0]
        print(f"| {name} | {len(texts) / elapsed:,.1f} | {ratio} | {cosine:.5f} | {gflops:,.1f} | "
              f"{gflops / peak:.0%} of {peak:,.0f} ({'int8' if 'int8' in name else 'fp32'}) |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="number of texts (default 1000)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass, every engine (default 32)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats, median reported (default 3)")
    parser.add_argument("--long", action="store_true", help="also a table on long texts (150+ word paragraphs)")
    parser.add_argument("--contention", action="store_true",
                        help="also rows with a competing process spinning on the last core")
    parser.add_argument("--engines", default="st,ours,ort,ct2", help="subset of st,ours,ort,ct2")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="avx2: limit torch (MKL, oneDNN, FBGEMM, ATen) and CTranslate2 to AVX2, to stand in for "
                             "an AVX2 CPU (ONNX Runtime keeps the CPU's own ISA)")
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    if args.n < 10 or args.batch_size < 1 or args.repeats < 1 or min(thread_counts) < 1:
        parser.error("--n must be at least 10; --batch-size, --repeats and --threads at least 1")

    import onnxruntime
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()
    folder = minilm_dir()
    paths = build_peer_models(folder, PEERS / "models")
    ctranslate2 = ensure_ctranslate2()
    tokenizer = bertforge.BertTokenizer.from_pretrained(folder)
    reference = SentenceTransformer(str(folder), device="cpu")
    flags = open("/proc/cpuinfo", encoding="utf-8").read().split("flags", 1)[1].split("\n", 1)[0]
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
            if f" {f}" in flags]
    print(f"all-MiniLM-L6-v2, batch {args.batch_size}, max length {MAX_LENGTH}; {device_name(torch.device('cpu'))} "
          f"({', '.join(simd)}); {os.cpu_count()} logical CPUs; bertforge {bertforge.__version__}, torch "
          f"{torch.__version__}, sentence-transformers {sentence_transformers.__version__}, onnxruntime "
          f"{onnxruntime.__version__}, ctranslate2 {ctranslate2.__version__}, Python {platform.python_version()}; "
          f"{datetime.datetime.now().isoformat(timespec='minutes')}; median of {args.repeats}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}")
    if args.isa == "avx2":
        print(f"AVX2 stood in for: torch's kernels at {torch.backends.cpu.get_cpu_capability()}, MKL, oneDNN, FBGEMM "
              "and CTranslate2 limited to AVX2 (ONNX Runtime's rows use the CPU's own ISA)")

    sets = [("mixed", load_texts(args.n))] + ([("long", long_texts(args.n // 4))] if args.long else [])
    for threads in thread_counts:
        int8_peak, kernel = int8_gemm_gflops(threads)
        peaks = (fp32_gemm_gflops(threads), int8_peak)
        print(f"\n{threads} thread(s): measured peak fp32 GEMM {peaks[0]:,.1f} GFLOP/s, "
              f"int8 GEMM ({kernel}) {peaks[1]:,.1f} GOP/s")
        engines = engines_at(threads, args, folder, paths, tokenizer, reference)
        for label, texts in sets:
            torch.set_num_threads(threads)
            truth = reference.encode(texts, batch_size=args.batch_size, normalize_embeddings=True)
            lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]]
            flops = encoder_flops(lengths, 384, 1536, 6)
            seconds, vectors = time_engines(engines, texts, args.repeats)
            print_table(f"{label} texts: {len(texts)} ({sum(lengths):,} tokens), {threads} thread(s)",
                        seconds, vectors, truth, texts, flops, peaks)
            if label == "long" and "ours" in args.engines:
                print_linear_layer_rates(folder, texts, args.batch_size, peaks)
            if args.contention:
                with competing_process(core=(os.cpu_count() or 1) - 1):
                    seconds, vectors = time_engines(engines, texts, args.repeats)
                print_table(f"{label} texts, {threads} thread(s), another process spinning on one core",
                            seconds, vectors, truth, texts, flops, peaks)


if __name__ == "__main__":
    main()
