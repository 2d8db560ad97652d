"""The naive baseline adapt must beat: one epoch of ICT with sentence-transformers' model and loss.

    python scripts/adapt_naive_st.py data/austen/emma.txt.gz --words 150000

The same passages and held-out ICT queries as `bertforge adapt --preset quick` (seed 0) when the
slice is the whole corpus; pairs are (sentence, the passage it is in, sentence KEPT),
MultipleNegativesRankingLoss with its defaults (scale 20, in-batch negatives only), batch 32,
lr 2e-5, one epoch, in the loop SentenceTransformer.fit runs (AdamW, linear warm-up 10% and
decay, clipping at 1; written out here because fit needs the `datasets` package, not installed). Prints nDCG@10
(dev/test) of all-MiniLM-L6-v2 zero-shot, BM25 and the fine-tuned model, alone and fused with BM25 at the
weight the dev queries pick (as adapt fuses its own models), and appends them to
scripts/results/adapt_naive_st.jsonl.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from bertforge.adapt.evaluation import Evaluator, ict_metrics
from bertforge.adapt.ict import held_out_queries, query_candidates, training_passages
from bertforge.adapt.presets import query_count, scored_passages
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import bm25_scores
from bertforge.tasks.retrieval.hybrid import remembered

RESULTS = Path(__file__).parent / "results" / "adapt_naive_st.jsonl"


def st_scorer(model):
    def scores(queries, documents):
        q = model.encode(list(queries), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        d = model.encode(list(documents), batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        return q @ d.T

    return scores


def train_one_epoch(model, anchors, positives, batch_size=32, learning_rate=2e-5, warmup=0.1, seed=0):
    """What SentenceTransformer.fit does for one epoch (the `datasets`-free way): shuffled batches,
    MultipleNegativesRankingLoss with its defaults, AdamW, linear warm-up then decay, clipping at 1."""
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    loss_function = MultipleNegativesRankingLoss(model)
    order = np.random.default_rng(seed).permutation(len(anchors))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = get_linear_schedule_with_warmup(optimizer, int(warmup * len(batches)), len(batches))
    model.train()
    for number, batch in enumerate(batches, start=1):
        features = [model.tokenize([anchors[i] for i in batch]), model.tokenize([positives[i] for i in batch])]
        loss = loss_function(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        print(f"step {number}/{len(batches)} loss {loss.item():.4f}", flush=True)
    model.eval()


def main() -> None:
    from sentence_transformers import SentenceTransformer

    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from adapt_experiment import corpus_slice

    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--words", type=int, default=150_000)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", help="DIR/report.json of `bertforge adapt` on the same corpus: print beside it")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    passages, words = corpus_slice(args.corpus, args.words, args.text_column, as_adapt=True)
    held_out = held_out_queries(passages, query_count("quick", len(passages)), np.random.default_rng(0),
                                max_scored=scored_passages("quick"))  # adapt's
    rng = np.random.default_rng(0)
    anchors, positives = [], []
    for index in training_passages(held_out.corpus):
        passage = held_out.corpus[index]
        anchors.append(passage.sentences[int(rng.choice(query_candidates(passage)))])
        positives.append(held_out.texts()[index])  # the sentence stays in: the naive pair
    model = SentenceTransformer(str(resolve_model("minilm")), device="cpu")
    record = {"corpus": args.corpus, "words": words, "pairs": len(anchors), "bm25": ict_metrics(bm25_scores, held_out)}
    if args.report:  # an adapt run on the same corpus: its base and final model on the same queries
        report = json.loads(Path(args.report).read_text())
        assert report["queries"] == {s: len(q) for s, q in held_out.queries.items()}, "not the same held-out queries"
        systems = {system["name"]: system for system in report["systems"]}
        record["base"], record["adapt"] = systems["base"]["metrics"], systems[report["final"]]["metrics"]
        if "hybrid" in systems[report["final"]]:
            # what DIR/index serves: fused with BM25, and since 2026-11-28 with best sentences and neighbours mixed in
            record["adapt + bm25"] = systems[report["final"]]["hybrid"]["metrics"]
    else:
        record["base"] = ict_metrics(st_scorer(model), held_out)
    started = time.time()
    train_one_epoch(model, anchors, positives)
    record["train_s"] = round(time.time() - started, 1)
    naive = remembered(st_scorer(model))
    record["naive_st"] = ict_metrics(naive, held_out)
    fused = Evaluator(held_out, tokenizer=None).hybrid(naive)
    record["naive_st + bm25"], record["naive_st_dense_weight"] = fused["metrics"], fused["dense_weight"]
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as file:
        file.write(json.dumps(record) + "\n")
    for name in ("bm25", "base", "naive_st", "naive_st + bm25", "adapt", "adapt + bm25"):
        if name not in record:
            continue
        print(f"{name:15s} nDCG@10 dev {record[name]['dev']['ndcg@10']:.4f} test {record[name]['test']['ndcg@10']:.4f}")
    base = record["base"]["test"]["ndcg@10"]
    print(f"naive/base test {record['naive_st']['test']['ndcg@10'] / base:.3f}x"
          + (f", adapt/base test {record['adapt']['test']['ndcg@10'] / base:.3f}x" if "adapt" in record else "")
          + f", naive training {record['train_s']} s")


if __name__ == "__main__":
    main()
