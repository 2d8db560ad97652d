"""nDCG@10 of an encoder fused with BM25 at every dense weight (tasks/retrieval/hybrid.py), on a corpus's
held-out ICT queries (as `bertforge adapt` draws them) and optionally a BEIR folder; no training.

    python scripts/hybrid_weights.py $BERTFORGE_DATA/drug-reviews/{train,test}.tsv --text-column review \
        --eval runs/retrieval/drug-reviews/test
    python scripts/hybrid_weights.py data/austen/emma.txt.gz

Prints one line per weight (1: the encoder alone, 0: BM25 alone); results in scripts/results/adapt_hybrid.md.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from bertforge.adapt.corpus_checks import read_adapt_corpus
from bertforge.adapt.evaluation import Evaluator, read_beir_folder
from bertforge.adapt.ict import held_out_queries
from bertforge.adapt.presets import query_count, scored_passages
from bertforge.models.folder import read_model_folder
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.hybrid import WEIGHTS, hybrid_scorer, remembered
from bertforge.tokenization.folder import load_tokenizer
from bertforge.tokenization.tokenizer import BertTokenizer


def corpus_arguments(description: str) -> argparse.ArgumentParser:
    """The command line of a script that scores models on a corpus's held-out queries as adapt draws them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--eval", default=None, help="a BEIR folder")
    parser.add_argument("--seed", type=int, default=0, help="adapt's --seed: the same held-out queries")
    return parser


def held_out_evaluator(args: argparse.Namespace) -> Evaluator:
    """adapt's Evaluator for args.corpus (its quick preset's held-out ICT queries) and args.eval; prints their sizes."""
    base = read_model_folder(resolve_model("minilm"))  # adapt's default base: its length splits the passages
    corpus = read_adapt_corpus(args.corpus, load_tokenizer(base), base.max_seq_length,
                               args.text_column)
    held_out = held_out_queries(corpus.passages, query_count("quick", len(corpus.passages)),
                                np.random.default_rng(args.seed), max_scored=scored_passages("quick"),
                                follows=corpus.passages.follows)
    print(f"{len(corpus.passages):,} passages, queries {({k: len(v) for k, v in held_out.queries.items()})}")
    return Evaluator(held_out, BertTokenizer.from_pretrained(resolve_model("minilm")),
                     read_beir_folder(args.eval) if args.eval else None)


def main() -> None:
    parser = corpus_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", help="a sentence-transformers folder or packaged name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    evaluator = held_out_evaluator(args)
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    dense = remembered(evaluator.with_tokenizer(tokenizer).scorer(BiEncoder.from_pretrained(folder)))
    for weight in WEIGHTS:
        results = evaluator.everything(hybrid_scorer(dense, evaluator.lexical, weight))
        print(f"dense weight {weight:.1f}: " + "  ".join(f"{split} {m['ndcg@10']:.3f}" for split, m in results.items()),
              flush=True)


if __name__ == "__main__":
    main()
