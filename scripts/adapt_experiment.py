"""One adapt experiment: a corpus slice, held-out ICT queries, BM25 + base + one training setting.

    python scripts/adapt_experiment.py data/austen/emma.txt.gz --words 40000 --epochs 2 --name e1

Appends one JSON line (settings, per-evaluation dev/test metrics, BM25, base, wall time) to
scripts/results/adapt_experiments.jsonl. The quick preset's defaults were chosen from these.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.adapt.corpus import read_corpus
from bertforge.adapt.evaluation import ict_metrics
from bertforge.adapt.ict import held_out_queries
from bertforge.adapt.methods import MethodSettings, train_method
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.evaluation import encoder_embedder, encoder_scorer
from bertforge.tokenization.tokenizer import BertTokenizer

RESULTS = Path(__file__).parent / "results" / "adapt_experiments.jsonl"


def corpus_slice(paths, words: int, text_column: str):
    passages = read_corpus(paths, text_column=text_column).passages
    kept, total = [], 0
    for passage in passages:
        if total >= words:
            break
        kept.append(passage)
        total += passage.words
    return kept, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--words", type=int, default=40_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--name", default="")
    parser.add_argument("--threads", type=int, default=2)
    for field, value in vars(MethodSettings()).items():
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(value, bool) else type(value)
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=value)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = MethodSettings(**{f: getattr(args, f) for f in vars(MethodSettings())})

    passages, words = corpus_slice(args.corpus, args.words, args.text_column)
    held_out = held_out_queries(passages, args.queries, np.random.default_rng(0))
    base = str(resolve_model("minilm"))
    tokenizer = BertTokenizer.from_pretrained(base)
    model = BiEncoder.from_pretrained(base)

    def evaluate(m):
        scores = ict_metrics(encoder_scorer(encoder_embedder(m, tokenizer, progress=False)), held_out)
        print({s: round(v["ndcg@10"], 4) for s, v in scores.items()}, flush=True)
        return {"ndcg@10": scores["dev"]["ndcg@10"], "test_ndcg@10": scores["test"]["ndcg@10"]}

    started = time.time()
    record = {"name": args.name, "corpus": args.corpus, "words": words, "passages": len(passages),
              "queries": {s: len(q) for s, q in held_out.queries.items()}, "settings": vars(settings),
              "bm25": ict_metrics(bm25_scores, held_out)}
    record["base"] = ict_metrics(encoder_scorer(encoder_embedder(model, tokenizer, progress=False)), held_out)
    print("bm25", record["bm25"]["dev"]["ndcg@10"], record["bm25"]["test"]["ndcg@10"],
          "base", record["base"]["dev"]["ndcg@10"], record["base"]["test"]["ndcg@10"], flush=True)
    with tempfile.TemporaryDirectory() as run_dir:
        train_started = time.time()
        logs = train_method(model, tokenizer, held_out.corpus, held_out.texts(), settings, Path(run_dir), evaluate,
                            torch.device("cpu"))
        record["train_s"] = round(time.time() - train_started, 1)
    record["evals"] = [{"step": r["step"], "ndcg@10": r["eval_ndcg@10"], "test_ndcg@10": r["eval_test_ndcg@10"]}
                       for r in logs if "eval_test_ndcg@10" in r]
    best = max(record["evals"], key=lambda r: r["ndcg@10"])
    record["best"] = best
    record["ratio_test"] = round(best["test_ndcg@10"] / record["base"]["test"]["ndcg@10"], 3)
    record["wall_s"] = round(time.time() - started, 1)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as file:
        file.write(json.dumps(record) + "\n")
    print(json.dumps({k: record[k] for k in ("name", "best", "ratio_test", "train_s", "wall_s")}))


if __name__ == "__main__":
    main()
