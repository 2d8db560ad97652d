"""nDCG@10 of models between the base and an adapted model, weight by weight (WiSE-FT, Wortsman et al. 2022):
(1 - a) * base + a * adapted for each a, alone and fused with BM25 at the dense weight its dev queries pick,
on a corpus's held-out ICT queries (as `bertforge adapt` draws them) and optionally a BEIR folder; no training.

    python scripts/interpolate_weights.py runs/retrieval/python-faq/corpus.jsonl --eval runs/retrieval/python-faq \
        --model DIR/model
"""
from __future__ import annotations

import torch

from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.hybrid import WEIGHTS, hybrid_scorer, remembered
from hybrid_weights import corpus_arguments, held_out_evaluator

SHARES = (0.0, 0.25, 0.5, 0.625, 0.75, 0.875, 1.0)


def main() -> None:
    parser = corpus_arguments(__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the adapted sentence-transformers folder")
    parser.add_argument("--base", default="minilm")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    evaluator = held_out_evaluator(args)
    base = BiEncoder.from_pretrained(resolve_model(args.base)).state_dict()
    model = BiEncoder.from_pretrained(args.model)
    adapted = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    for share in SHARES:
        model.load_state_dict({name: torch.lerp(base[name].float(), adapted[name].float(), share).to(adapted[name].dtype)
                               if adapted[name].is_floating_point() else adapted[name] for name in adapted})
        dense = remembered(evaluator.scorer(model))
        fused = {w: evaluator.everything(hybrid_scorer(dense, evaluator.lexical, w)) for w in WEIGHTS}
        pick = max(WEIGHTS, key=lambda w: fused[w]["dev"]["ndcg@10"])
        line = lambda results: "  ".join(f"{split} {m['ndcg@10']:.4f}" for split, m in results.items())
        print(f"share {share:.3f} alone: {line(fused[1.0])} | + BM25 ({pick:.1f}): {line(fused[pick])}", flush=True)


if __name__ == "__main__":
    main()
