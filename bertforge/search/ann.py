"""The FAISS index underneath: which kind for which size, its search effort, and its recall against exact search.

Kinds (all by inner product; with normalised vectors that is cosine similarity):
- "flat": exact search, every stored vector scored (faiss IndexFlatIP).
- "ivf": vectors bucketed by k-means into `ivf_lists(n)` lists; a query scans `nprobe` lists
  (IndexIVFFlat). Fast to build and to append to; the choice above EXACT_UP_TO vectors.
- "hnsw": a navigable graph (IndexHNSWFlat, 32 links per vector): the fastest queries for a
  given recall, but slow to build and about 260 bytes per vector more memory.
"auto" is flat up to EXACT_UP_TO vectors, ivf above. The approximate kinds' effort (nprobe,
efSearch) is tuned at build to the smallest value whose recall@10 against exact search
reaches RECALL_TARGET, on typical queries when given, else on a sample of stored vectors
(then never below STORED_TUNING_FLOOR).
"""
from __future__ import annotations

import math
from typing import get_args
from dataclasses import dataclass

import numpy as np

from ..errors import BertforgeError, UsageError
from ..validation import checked
from . import IndexKind

try:
    import faiss
except ImportError:  # an optional extra: say how to get it instead of a traceback
    raise BertforgeError("vector search needs FAISS: pip install 'bertforge[search]' (or pip install faiss-cpu)") from None

KINDS = get_args(IndexKind)
# Up to this many vectors exact search stays within tens of milliseconds a query on one core
# (benchmarks/bench_search.py), needs no training and has perfect recall.
EXACT_UP_TO = 100_000
RECALL_TARGET = 0.95
RECALL_QUERIES = 1000
HNSW_LINKS = 32
HNSW_BUILD_EFFORT = 80
# Efforts tried in order when tuning: nprobe (lists scanned) for ivf, efSearch for hnsw.
EFFORT_STEPS = {"ivf": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                "hnsw": (32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)}
# Stored vectors are easier queries than real ones (a stored vector's near-duplicates sit in its
# own list): in benchmarks/bench_search.py, nprobe tuned on them to 0.97 gave real held-out
# queries a recall@10 of 0.37 at 1M vectors. Tuned on stored vectors, the effort is never below
# these floors (nprobe 32 scans under 1% of a 1M-vector ivf index).
STORED_TUNING_FLOOR = {"ivf": 32, "hnsw": 64}
# faiss's k-means wants at least 39 training vectors per list; 64 gives steadier centroids.
TRAINING_PER_LIST = 64


def resolve_kind(kind: IndexKind, count: int) -> str:
    if kind not in KINDS:
        raise UsageError(f"index kind {kind!r} is not one of {KINDS}")
    if kind == "auto":
        return "flat" if count <= EXACT_UP_TO else "ivf"
    if kind == "ivf" and count < 2 * 39:  # k-means into at least 2 lists of 39
        raise ValueError(f"an ivf index needs more vectors to learn its lists from than {count}; use --kind flat "
                         f"(exact, and the right choice below {EXACT_UP_TO:,} vectors)")
    return kind


def ivf_lists(count: int) -> int:
    """k-means lists for `count` vectors: 4 * sqrt(n), the low end of faiss's guideline (4 to 16 * sqrt(n)),
    so that training stays minutes on a laptop at 1M vectors; never fewer than 39 vectors a list."""
    return max(1, min(int(4 * math.sqrt(count)), count // 39))


def new_faiss_index(kind: str, dim: int, count: int) -> faiss.Index:
    """An empty index of a resolved kind ("flat", "ivf", "hnsw") for about `count` vectors of size `dim`."""
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivf":
        quantizer = faiss.IndexFlatIP(dim)
        # faiss's Python wrapper keeps a reference to the quantizer inside the index.
        return faiss.IndexIVFFlat(quantizer, dim, ivf_lists(count), faiss.METRIC_INNER_PRODUCT)
    index = faiss.IndexHNSWFlat(dim, HNSW_LINKS, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_BUILD_EFFORT
    return index


def training_rows(index: faiss.Index, count: int, rng: np.random.Generator) -> np.ndarray | None:
    """Rows to train an ivf index on (sorted, so chunked files are read in order); None when no training is needed."""
    if index.is_trained:
        return None
    wanted = min(count, TRAINING_PER_LIST * faiss.extract_index_ivf(index).nlist)
    return np.sort(rng.choice(count, size=wanted, replace=False))


def check_effort(kind: str, effort) -> int:
    """A user's effort (nprobe / efSearch), or ValueError saying why it does not apply."""
    if kind == "flat":
        raise UsageError("a flat index searches exactly; it has no effort to set (leave out --effort)")
    return checked("effort", effort)


def set_effort(index: faiss.Index, kind: str, effort: int | None) -> None:
    if kind == "ivf" and effort is not None:
        faiss.extract_index_ivf(index).nprobe = int(effort)
    elif kind == "hnsw" and effort is not None:
        index.hnsw.efSearch = int(effort)


def stored_vectors(index: faiss.Index, kind: str, rows: np.ndarray) -> np.ndarray:
    """The stored vectors (len(rows), dim) of `rows`, exactly as added: every kind here keeps whole vectors.

    flat and hnsw (its flat storage) give them directly. ivf (IndexIVFFlat: whole vectors in its
    lists) first gets a direct map row -> list entry, on first use: 8 bytes a row, kept by later
    adds and written into the saved .faiss file. (A PQ-coded index, not built here, would give its
    decoded approximations instead.)
    """
    if kind == "ivf":
        ivf = faiss.extract_index_ivf(index)
        if ivf.direct_map.no():
            ivf.make_direct_map()
    return index.reconstruct_batch(np.ascontiguousarray(rows, dtype=np.int64))


def flat_vectors(index: faiss.Index) -> np.ndarray:
    """Every vector of a flat index (ntotal, dim): a view of FAISS's own array, no copy, valid until the next add."""
    return faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d).reshape(index.ntotal, index.d)


@dataclass
class Neighbours:
    """Top-k of several queries: scores and rows, float32 / int64 (queries, k), best first; row -1 = none."""
    scores: np.ndarray
    rows: np.ndarray


def exact_neighbours(queries: np.ndarray, vector_chunks, k: int) -> Neighbours:
    """Exact inner-product top-k of queries over vectors given chunk by chunk (never all in memory at once)."""
    best = Neighbours(np.full((len(queries), 0), -np.inf, np.float32), np.zeros((len(queries), 0), np.int64))
    start = 0
    for chunk in vector_chunks:
        scores, rows = faiss.knn(queries, chunk, min(k, len(chunk)), metric=faiss.METRIC_INNER_PRODUCT)
        merged_scores = np.concatenate([best.scores, scores], axis=1)
        merged_rows = np.concatenate([best.rows, rows + start], axis=1)
        order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
        best = Neighbours(np.take_along_axis(merged_scores, order, 1), np.take_along_axis(merged_rows, order, 1))
        start += len(chunk)
    return best


def recall_at_k(found: Neighbours, truth: Neighbours, query_rows: np.ndarray | None, k: int) -> float:
    """Share of the exact top-k that the index found.

    Both lists were searched with k + 1. For queries that are stored vectors (query_rows
    their rows), each query's own row is dropped from both, so a vector finding itself earns
    nothing; other queries (query_rows None) keep their first k. A found row that ties the
    exact k-th score counts as a hit: with duplicate texts the exact top-k is one of several
    equally right answers.
    """
    own_rows = query_rows if query_rows is not None else np.full(len(found.rows), -2)  # -2: never a row
    hits = 0
    for query, row in enumerate(own_rows):
        exact_rows = [r for r in truth.rows[query] if r != row][:k]
        exact_scores = [s for r, s in zip(truth.rows[query], truth.scores[query]) if r != row][:k]
        kth_score = exact_scores[-1] if exact_scores else np.inf
        found_pairs = [(r, s) for r, s in zip(found.rows[query], found.scores[query]) if r != row and r >= 0][:k]
        hits += sum(1 for r, s in found_pairs if r in exact_rows or s >= kth_score - 1e-5)
    return hits / (k * len(own_rows))


def tune_effort(index: faiss.Index, kind: str, queries: np.ndarray, query_rows: np.ndarray | None, truth: Neighbours,
                k: int = 10, target: float = RECALL_TARGET) -> list[tuple[int, float]]:
    """Try EFFORT_STEPS in order, stop at the first whose recall@k reaches target; leave the index set to it.

    With stored vectors as queries (query_rows given), steps start at STORED_TUNING_FLOOR.
    Returns [(effort, recall@k), ...] for each effort tried (the last one is the one set).
    """
    floor = STORED_TUNING_FLOOR[kind] if query_rows is not None else 1
    steps = [step for step in EFFORT_STEPS[kind] if step >= floor]
    if kind == "ivf":  # scanning every list is the most an ivf index can do
        nlist = faiss.extract_index_ivf(index).nlist
        steps = [step for step in steps if step < nlist] + [nlist]
    tried = []
    for effort in steps:
        set_effort(index, kind, effort)
        scores, rows = index.search(queries, k + 1)
        tried.append((effort, recall_at_k(Neighbours(scores, rows), truth, query_rows, k)))
        if tried[-1][1] >= target:
            break
    return tried


def gpu_replica(index: faiss.Index, kind: str) -> faiss.Index | None:
    """A copy of a flat or ivf index on GPU 0 to search with, where FAISS was built with GPU support
    (faiss-gpu) and sees a GPU; None otherwise (faiss-cpu, no GPU, or hnsw, which FAISS keeps on CPU).
    The CPU index stays the one that is added to and saved. Not exercised on a GPU yet."""
    if kind == "hnsw" or not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return None
    resources = faiss.StandardGpuResources()
    replica = faiss.index_cpu_to_gpu(resources, 0, index)  # copies the vectors and nprobe
    replica.referenced_objects = [resources]  # the GPU memory lives as long as the replica
    return replica


def measure_recall(faiss_index: faiss.Index, kind: str, vector_chunks, rng: np.random.Generator,
                   k: int = 10, queries: np.ndarray | None = None) -> dict:
    """Tune an approximate index's effort to recall@k >= RECALL_TARGET; for flat, recall is 1.

    vector_chunks: a list of (rows, dim) arrays holding every stored vector in row order
    (or a callable returning a fresh iterator of them, for chunks read from files).
    queries: vectors of queries like the ones the index will get (the truest tuning); by
    default RECALL_QUERIES stored vectors sampled with rng stand in for them.
    """
    if kind == "flat":
        return {"effort": None, "recall_at_10": 1.0, "recall_queries": 0}
    chunks = vector_chunks if callable(vector_chunks) else (lambda: iter(vector_chunks))
    query_rows = None
    if queries is None:
        count = int(faiss_index.ntotal)
        query_rows = np.sort(rng.choice(count, size=min(RECALL_QUERIES, count), replace=False))
        queries = gather_rows(chunks(), query_rows)
    truth = exact_neighbours(queries, chunks(), k + 1)
    tried = tune_effort(faiss_index, kind, queries, query_rows, truth, k)
    return {"effort": tried[-1][0], "recall_at_10": tried[-1][1], "recall_queries": len(queries),
            "recall_on": "stored vectors" if query_rows is not None else "given queries",
            "tuning": [list(step) for step in tried]}


def gather_rows(vector_chunks, rows: np.ndarray) -> np.ndarray:
    """The vectors at sorted `rows` from chunks given in row order."""
    picked, start = [], 0
    for chunk in vector_chunks:
        inside = rows[(rows >= start) & (rows < start + len(chunk))]
        picked.append(chunk[inside - start])
        start += len(chunk)
    return np.ascontiguousarray(np.concatenate(picked), dtype=np.float32)
