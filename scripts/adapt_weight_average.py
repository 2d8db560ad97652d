"""Does averaging an adapted encoder with its base (WiSE-FT, Wortsman et al. 2022) keep the base's general
similarity? Scores the weight average at each mix on a BEIR folder, beside the two ends.

    python scripts/adapt_weight_average.py minilm runs/adapt-drugs/model runs/retrieval/drug-reviews/test \
        --mix 0 0.3 0.5 1
"""
from __future__ import annotations

import argparse

import torch

from bertforge import BertTokenizer
from bertforge.adapt.evaluation import RECALL_AT, read_beir_folder
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.evaluation import encoder_embedder, encoder_scorer, evaluate_retrieval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the base model folder or packaged name (minilm)")
    parser.add_argument("adapted", help="DIR/model of a bertforge adapt run")
    parser.add_argument("beir", help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels)")
    parser.add_argument("--mix", type=float, nargs="+", default=[0.0, 0.3, 0.5, 1.0],
                        help="share of the adapted weights: 0 is the base, 1 the adapted model")
    args = parser.parse_args()
    beir = read_beir_folder(args.beir)
    tokenizer = BertTokenizer.from_pretrained(args.adapted)
    base = BiEncoder.from_pretrained(resolve_model(args.base)).state_dict()
    adapted = BiEncoder.from_pretrained(args.adapted).state_dict()
    for mix in args.mix:
        model = BiEncoder.from_pretrained(args.adapted)
        with torch.no_grad():
            model.load_state_dict({name: (1 - mix) * base[name] + mix * weight if weight.is_floating_point() else weight
                                   for name, weight in adapted.items()})
        metrics = evaluate_retrieval(encoder_scorer(encoder_embedder(model, tokenizer, batch_size=64, progress=False)),
                                     beir, recall_at=RECALL_AT)
        print(f"mix {mix:.2f}: " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()), flush=True)


if __name__ == "__main__":
    main()
