"""BM25 with and without stems (Snowball English, `tasks/retrieval/baselines.bm25_tokens`), alone and fused with
each encoder at the weight its dev queries pick, on a corpus's held-out ICT queries and optionally a BEIR folder.

    python scripts/bm25_stemming.py runs/retrieval/python-faq/corpus.jsonl --eval runs/retrieval/python-faq \
        --model minilm --model runs/adapt-pyfaq/model

Prints nDCG@10 per query set; results in scripts/results/adapt_hybrid.md.
"""
from __future__ import annotations

import numpy as np
import torch
from hybrid_weights import corpus_arguments, held_out_evaluator

from bertforge.adapt.evaluation import Evaluator
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import bm25_scores, require_bm25s
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.hybrid import hybrid_scorer, remembered
from bertforge.tokenization.tokenizer import BertTokenizer


def unstemmed_bm25_scores(queries: list[str], documents: list[str]) -> np.ndarray:
    """bm25_scores as it was before stems: the same index and stop words, words as they are."""
    bm25s = require_bm25s()
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(documents), stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    return np.stack([index.get_scores(query) if query else np.zeros(len(documents))
                     for query in tokens]).astype(np.float32)


def main() -> None:
    parser = corpus_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="a sentence-transformers folder or packaged "
                        "name (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    evaluator = held_out_evaluator(args)
    analyzers = {"words": remembered(unstemmed_bm25_scores), "stems": remembered(bm25_scores)}

    def line(results: dict) -> str:
        return "  ".join(f"{split} {metrics['ndcg@10']:.4f}" for split, metrics in results.items())

    for name, lexical in analyzers.items():
        print(f"BM25 on {name}: {line(evaluator.everything(lexical))}", flush=True)
    for model in args.model or ["minilm"]:
        folder = resolve_model(model)
        dense = remembered(evaluator.with_tokenizer(BertTokenizer.from_pretrained(folder))
                           .scorer(BiEncoder.from_pretrained(folder)))
        print(f"{model} alone: {line(evaluator.everything(dense))}", flush=True)
        for name, lexical in analyzers.items():
            scored = Evaluator(evaluator.held_out, evaluator.tokenizer, evaluator.beir, lexical=lexical)
            weight = scored.best_weight(dense)
            print(f"  + BM25 on {name} (dense weight {weight:g}): "
                  f"{line(scored.everything(hybrid_scorer(dense, lexical, weight)))}", flush=True)


if __name__ == "__main__":
    main()
