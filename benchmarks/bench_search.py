"""Vector search at scale: bertforge's Index against FAISS used directly, per index kind.

Vectors: --real distinct Austen sentences and tweets embedded with all-MiniLM-L6-v2 (cached
in --cache), repeated with Gaussian noise up to --vectors and L2-normalised again: the noise
has norm 1, so a copy's cosine to its source is about 0.7, near what real neighbours score,
and copies do not collapse into trivially easy clusters. Queries are --queries other real
texts, never indexed. For each kind (flat = exact, ivf, hnsw):
  - build: `Index.from_vectors` (train, add, and tune nprobe/efSearch to recall@10 >= 0.95
    on 1,000 stored vectors) vs FAISS alone (train + add, no tuning);
  - index size on disk (the .faiss file, and the whole folder with ids and texts);
  - RSS: the process's resident memory after the build, and what the build added;
  - latency p50/p99: batch 1 (one query per call) and batch 64, bertforge `Index.search` on
    the saved-and-loaded index (hits come with their ids and texts, read from disk) vs
    `faiss_index.search` alone (rows and scores only);
  - recall@10 against exact search: at build, on 1,000 stored vectors as queries (what
    `index build` prints), and for the held-out queries (the second half: --queries / 2);
  - for ivf and hnsw, a second table: the effort tuned instead on the first half of the
    held-out queries (`index build --tune-queries`), and what it gives on the second half.
ratio = FAISS time / bertforge time (below 1: the wrapper costs that much).

    python benchmarks/bench_search.py [--vectors 100000] [--real 4000] [--kinds flat,ivf,hnsw]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import torch

import bertforge
from bertforge.tasks.pretraining.corpus import read_documents
from bertforge.search.corpus import Passage
from bertforge.search.encoder import open_model
from bertforge.search.ann import measure_recall
from bertforge.search.index import Index

DATA_DIR = Path(os.environ.get("BERTFORGE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def real_texts(count: int) -> list[str]:
    """Distinct real texts: Austen sentences and tweets, interleaved, in a fixed order."""
    austen = [s for d in read_documents(DATA_DIR / "austen" / "persuasion.txt") for s in d]
    austen += [s for d in read_documents(DATA_DIR / "austen" / "emma.txt") for s in d]
    with open(DATA_DIR / "tweets-sentiment" / "tweets.csv", encoding="utf-8", newline="") as file:
        tweets = [row["text"] for row in csv.DictReader(file)]
    seen, texts = set(), []
    for pair in zip(austen, tweets):
        for text in pair:
            if len(text.split()) >= 4 and text not in seen:
                seen.add(text)
                texts.append(text)
    if len(texts) < count:
        raise SystemExit(f"only {len(texts)} distinct real texts; ask for --real up to that")
    return texts[:count]


def embedded(texts: list[str], cache: Path):
    spec, embedder = open_model("minilm", batch_size=64, progress=True)
    if cache.is_file():
        vectors = np.load(cache)
        if vectors.shape == (len(texts), spec.dim):
            return spec, vectors
    vectors = embedder.encode(texts)
    np.save(cache, vectors)
    return spec, vectors


def noisy_copies(vectors: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """count rows: the real vectors first, then noisy copies (noise of norm ~1), all unit length."""
    out = np.empty((count, vectors.shape[1]), np.float32)
    out[:len(vectors)] = vectors[:count]
    for start in range(len(vectors), count, 65536):
        rows = min(65536, count - start)
        source = vectors[rng.integers(0, len(vectors), rows)]
        noise = rng.standard_normal(source.shape, dtype=np.float32) / np.sqrt(vectors.shape[1])
        out[start:start + rows] = source + noise
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def latencies(function, batches) -> tuple[float, float]:
    """(p50, p99) in milliseconds of function(batch) over the batches, after one warm-up call."""
    function(batches[0])
    times = []
    for batch in batches:
        start = time.perf_counter()
        function(batch)
        times.append((time.perf_counter() - start) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.iterdir()) / 1e6


def bare_faiss_build(kind: str, vectors: np.ndarray, bertforge_index: Index) -> float:
    """Seconds for FAISS alone to build the same kind with the same parameters (no tuning, no texts)."""
    from bertforge.search import ann

    start = time.perf_counter()
    index = ann.new_faiss_index(kind, vectors.shape[1], len(vectors))
    if not index.is_trained:
        rows = np.sort(np.random.default_rng(0).choice(len(vectors), min(len(vectors), 64 * ann.ivf_lists(len(vectors))),
                                                       replace=False))
        index.train(vectors[rows])
    index.add(vectors)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=100_000)
    parser.add_argument("--real", type=int, default=4000, help="distinct real texts embedded")
    parser.add_argument("--queries", type=int, default=256,
                        help="held-out real texts: half tune the effort, half measure")
    parser.add_argument("--kinds", default="flat,ivf,hnsw")
    parser.add_argument("--threads", type=int, default=1,
                        help="FAISS/torch threads (1: on a shared CPU, OpenMP's spin-waits inflate small queries)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench_search_vectors.npy")
    args = parser.parse_args()
    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)

    texts = real_texts(args.real + args.queries)
    spec, real = embedded(texts, args.cache)
    rng = np.random.default_rng(0)
    base = noisy_copies(real[:args.real], args.vectors, rng)
    tune_queries, queries = real[args.real:args.real + args.queries // 2], real[args.real + args.queries // 2:]
    base_texts = [texts[i % args.real] for i in range(args.vectors)]
    passages = [Passage(i, base_texts[i]) for i in range(args.vectors)]
    truth = faiss.knn(queries, base, 10, metric=faiss.METRIC_INNER_PRODUCT)[1]

    print(f"# bench_search: {args.vectors:,} vectors of size {spec.dim} ({args.real:,} real texts embedded by "
          f"all-MiniLM-L6-v2{', the rest noisy copies' if args.vectors > args.real else ''}), "
          f"{len(queries)} held-out real queries")
    print(f"# {datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"{args.threads} threads; faiss {faiss.__version__}, numpy {np.__version__}, torch {torch.__version__}, "
          f"bertforge {bertforge.__version__}; load average {os.getloadavg()[0]:.1f}; "
          f"RSS before building {rss_mb():,.0f} MB\n")
    print("| kind | build s: bertforge (tuned) / faiss / ratio | effort | .faiss MB | folder MB | RSS MB (+build) "
          "| batch 1 p50/p99 ms: bertforge / faiss | batch 64 p50/p99 ms: bertforge / faiss "
          "| recall@10 stored (build) / held-out |")
    print("|---|---|---|---|---|---|---|---|---|")
    tuned_rows = []
    single = [queries[i:i + 1] for i in range(len(queries))]
    batched = [queries[np.arange(i, i + 64) % len(queries)] for i in range(0, max(len(queries), 640), 64)]
    for kind in args.kinds.split(","):
        before = rss_mb()
        start = time.perf_counter()
        index = Index.from_vectors(spec, base, passages, kind=kind)
        build = time.perf_counter() - start
        after = rss_mb()
        bare = bare_faiss_build(kind, base, index)
        folder = Path(tempfile.mkdtemp()) / "index"
        index.save(folder)
        index = None  # free its memory before loading the saved copy
        loaded = Index.load(folder)
        ours1 = latencies(lambda q: loaded.search(q, top_k=10), single)
        bare1 = latencies(lambda q: loaded.faiss_index.search(q, 10), single)
        ours64 = latencies(lambda q: loaded.search(q, top_k=10), batched)
        bare64 = latencies(lambda q: loaded.faiss_index.search(q, 10), batched)
        found = loaded.faiss_index.search(queries, 10)[1]
        recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])
        faiss_mb = (folder / loaded.meta["files"]["faiss"]).stat().st_size / 1e6
        effort = {"ivf": "nprobe", "hnsw": "efSearch"}.get(kind, "exact")
        print(f"| {kind} | {build:.1f} / {bare:.1f} / {bare / build:.2f} | {effort} {loaded.meta['effort'] or ''} "
              f"| {faiss_mb:,.0f} | {folder_mb(folder):,.0f} | {after:,.0f} (+{after - before:,.0f}) "
              f"| {ours1[0]:.2f}/{ours1[1]:.2f} / {bare1[0]:.2f}/{bare1[1]:.2f} "
              f"| {ours64[0]:.1f}/{ours64[1]:.1f} / {bare64[0]:.1f}/{bare64[1]:.1f} "
              f"| {loaded.meta['recall_at_10']:.3f} / {recall:.3f} |", flush=True)
        if kind != "flat":
            tuned = measure_recall(loaded.faiss_index, kind, [base], rng, queries=tune_queries)
            found = loaded.faiss_index.search(queries, 10)[1]
            tuned_recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])
            latency = latencies(lambda q: loaded.search(q, top_k=10), single)
            tuned_rows.append(f"| {kind} | {effort} {tuned['effort']} | {tuned['recall_at_10']:.3f} "
                              f"| {tuned_recall:.3f} | {latency[0]:.2f}/{latency[1]:.2f} |")
        loaded = None
        shutil.rmtree(folder.parent)
    if tuned_rows:
        print(f"\nTuned on {len(tune_queries)} held-out queries instead (`--tune-queries`), measured on the other "
              f"{len(queries)}:\n")
        print("| kind | effort | recall@10 on the tuning queries | recall@10 held-out | batch 1 p50/p99 ms |")
        print("|---|---|---|---|---|")
        print("\n".join(tuned_rows))


if __name__ == "__main__":
    main()
