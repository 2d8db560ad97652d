"""One adapt experiment: a corpus slice, held-out ICT queries, BM25 + base + one training setting.

    python scripts/adapt_experiment.py $BERTFORGE_DATA/austen/emma.txt.gz --words 40000 --epochs 2 --name e1
    python scripts/adapt_experiment.py $BERTFORGE_DATA/drug-reviews/{train,test}.tsv --text-column review \
        --words 90000 --eval runs/retrieval/drug-reviews/test --distillation 1 --name drugs-kd1

Every evaluation scores the dev and test ICT queries (and the --eval BEIR folder), so the table
shows what each step of training did to each. Appends one JSON line (settings, per-evaluation
metrics, BM25, base, wall time) to scripts/results/adapt_experiments.jsonl. The quick preset's
defaults were chosen from these.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.search.documents import read_corpus
from bertforge.adapt.evaluation import Evaluator, read_beir_folder
from bertforge.adapt.ict import held_out_queries
from bertforge.adapt.methods import MethodSettings, train_method
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tokenization.tokenizer import BertTokenizer

RESULTS = Path(__file__).parent / "results" / "adapt_experiments.jsonl"


def corpus_slice(paths, words: int, text_column: str, as_adapt: bool = False):
    """The corpus's first passages up to `words` words; as_adapt: read as `bertforge adapt` reads it with its default
    base (passages split to fit its word pieces), so that a whole corpus draws adapt's held-out queries."""
    if as_adapt:
        from bertforge.adapt.corpus_checks import read_adapt_corpus
        from bertforge.models.folder import read_model_folder
        from bertforge.resources import resolve_model
        from bertforge.tokenization.folder import load_tokenizer

        base = read_model_folder(resolve_model("minilm"))
        passages = read_adapt_corpus(paths, load_tokenizer(base), base.max_seq_length, text_column).passages
    else:
        passages = read_corpus(paths, text_column=text_column).passages
    kept, total = [], 0
    for passage in passages:
        if total >= words:
            break
        kept.append(passage)
        total += passage.words
    return kept, total


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--words", type=int, default=40_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--eval", default=None, help="a BEIR folder scored at every evaluation")
    parser.add_argument("--base", default="minilm")
    parser.add_argument("--name", default="")
    parser.add_argument("--threads", type=int, default=1)
    for field, value in vars(MethodSettings()).items():
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(value, bool) else type(value)
        kind = float if value is None else kind  # attention_dropout: None is the model's own
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=value)
    return parser.parse_args()


def summary(metrics: dict) -> dict:
    return {split: round(values["ndcg@10"], 4) for split, values in metrics.items()}


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    settings = MethodSettings(**{f: getattr(args, f) for f in vars(MethodSettings())})
    passages, words = corpus_slice(args.corpus, args.words, args.text_column)
    held_out = held_out_queries(passages, args.queries, np.random.default_rng(0))
    base = resolve_model(args.base)
    tokenizer = BertTokenizer.from_pretrained(base)
    evaluator = Evaluator(held_out, tokenizer, read_beir_folder(args.eval) if args.eval else None)
    started = time.time()
    record = {"name": args.name, "corpus": args.corpus, "words": words, "passages": len(passages),
              "queries": {s: len(q) for s, q in held_out.queries.items()}, "settings": vars(settings),
              "bm25": evaluator.everything(bm25_scores),
              "base": evaluator.everything(evaluator.scorer(BiEncoder.from_pretrained(base)))}
    print("bm25", summary(record["bm25"]), "base", summary(record["base"]), flush=True)

    evaluations = []

    def evaluate(model) -> dict[str, float]:
        results = evaluator.everything(evaluator.scorer(model))
        evaluations.append(summary(results))
        print(evaluations[-1], flush=True)
        return {"ndcg@10": results["dev"]["ndcg@10"], "test_ndcg@10": results["test"]["ndcg@10"]}

    with tempfile.TemporaryDirectory() as run_dir:
        train_started = time.time()
        _, logs = train_method(base, held_out.corpus, held_out.texts(), settings, Path(run_dir), evaluate, "cpu")
        record["train_s"] = round(time.time() - train_started, 1)
    steps = [r["step"] for r in logs if "eval_ndcg@10" in r]
    record["evals"] = [{"step": step, **scores} for step, scores in zip(steps, evaluations)]
    best = max(record["evals"], key=lambda r: r["dev"])
    record["best"] = best
    record["ratio_test"] = round(best["test"] / record["base"]["test"]["ndcg@10"], 3)
    record["wall_s"] = round(time.time() - started, 1)
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as file:
        file.write(json.dumps(record) + "\n")
    print(json.dumps({k: record[k] for k in ("name", "best", "ratio_test", "train_s", "wall_s")}))


if __name__ == "__main__":
    main()
