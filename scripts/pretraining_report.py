"""Held-out results of a pretraining run against the unigram baseline, and whether it uses context yet.

The baseline always predicts the training corpus's most frequent token (accuracy) or its
unigram distribution (loss), on the very instances the run's evaluation used.

Context: a BERT that reads its context has heads that attend to the neighbouring tokens
(measured on Persuasion in 64-token windows: all-MiniLM-L6-v2's best layer-0 head puts 0.999 of
its weight on the previous token, its best layer-1 head 0.72 on the next). On the early plateau
of pretraining every head's weight on a neighbour stays near uniform (1 / 64 = 0.016), and
fill-mask answers with the most frequent tokens whatever the context.
Usage: python scripts/pretraining_report.py RECIPE.yaml [overrides...]
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from bertforge import BertModel
from bertforge.tasks.pretraining.dataset import PretrainingDataset
from bertforge.tasks.pretraining.shards import TokenizedCorpus
from bertforge.tasks.pretraining.recipe import PretrainRecipe
from bertforge.train.checkpointing import latest_checkpoint


def unigram_baseline(recipe: PretrainRecipe) -> dict[str, float]:
    run_dir = Path(recipe.training.output_dir)
    train = TokenizedCorpus(run_dir / "data" / "train")
    counts = np.bincount(all_tokens(train), minlength=train.vocab_size)
    probabilities = (counts + 1) / (counts.sum() + len(counts))  # add-one, so no held-out token has p = 0
    heldout = PretrainingDataset(TokenizedCorpus(run_dir / "data" / "heldout"), recipe.data.instances, seed=12345)
    labels, next_sentence = [], []
    for index, batch in enumerate(DataLoader(heldout, batch_size=recipe.batch_size, collate_fn=heldout.collate)):
        if index == recipe.data.eval_batches:
            break
        labels.append(batch["labels"][batch["labels"] != -100].numpy())
        next_sentence.append(batch.get("next_sentence_label", np.zeros(0)).numpy())
    labels, next_sentence = np.concatenate(labels), np.concatenate(next_sentence)
    # One-sentence documents always get a random B, so the majority class, not 50%, is the NSP baseline.
    majority = max(next_sentence.mean(), 1 - next_sentence.mean()) if len(next_sentence) else float("nan")
    return {"mlm_accuracy": float((labels == counts.argmax()).mean()),
            "mlm_loss": float(-np.log(probabilities[labels]).mean()), "masked_tokens": len(labels),
            "most_frequent": train.vocab_tokens[int(counts.argmax())], "nsp_majority": float(majority)}


def all_tokens(corpus: TokenizedCorpus) -> np.ndarray:
    return np.concatenate([np.concatenate(corpus.document(i)) for i in range(corpus.num_documents)])


@torch.inference_mode()
def neighbour_attention(model_dir: Path, heldout: TokenizedCorpus, sequences: int = 64, length: int = 64):
    """Per layer, the largest mean weight any head puts on the previous and on the next token.

    Measured on held-out text cut into `sequences` windows of `length` tokens (no padding, no masks).
    """
    model = BertModel.from_pretrained(model_dir).eval()
    tokens = all_tokens(heldout)
    windows = torch.as_tensor(tokens[: sequences * length].reshape(sequences, length).astype(np.int64))
    attentions = model(input_ids=windows, output_attentions=True).attentions  # per layer (batch, heads, q, k)
    return [(float(a.diagonal(-1, dim1=-2, dim2=-1).mean(dim=(0, 2)).max()),
             float(a.diagonal(1, dim1=-2, dim2=-1).mean(dim=(0, 2)).max())) for a in attentions], 1 / length


def main() -> None:
    recipe = PretrainRecipe.from_file(sys.argv[1], sys.argv[2:])
    records = [json.loads(l) for l in (Path(recipe.training.output_dir) / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if "eval_mlm_loss" in r]
    first, last = evaluations[0], evaluations[-1]
    baseline = unigram_baseline(recipe)
    print(f"held-out masked tokens: {baseline['masked_tokens']:,}; most frequent training token: {baseline['most_frequent']!r}\n")
    print("| | MLM accuracy | MLM loss | NSP accuracy |")
    print("|---|---|---|---|")
    print(f"| unigram baseline (NSP: majority class) | {baseline['mlm_accuracy']:.3f} | {baseline['mlm_loss']:.3f} "
          f"| {baseline['nsp_majority']:.3f} |")
    for name, r in ((f"model at step {first['step']}", first), (f"model at step {last['step']}", last)):
        nsp = f"{r['eval_nsp_accuracy']:.3f}" if "eval_nsp_accuracy" in r else "-"
        print(f"| {name} | {r['eval_mlm_accuracy']:.3f} | {r['eval_mlm_loss']:.3f} | {nsp} |")
    checkpoint = latest_checkpoint(Path(recipe.training.output_dir))
    if checkpoint is not None:
        heldout = TokenizedCorpus(Path(recipe.training.output_dir) / "data" / "heldout")
        per_layer, uniform = neighbour_attention(checkpoint / "model", heldout)
        print(f"\nattention on neighbours ({checkpoint.name}; uniform would be {uniform:.3f}):\n")
        print("| layer | best head on the previous token | best head on the next token |")
        print("|---|---|---|")
        for layer, (previous, following) in enumerate(per_layer):
            print(f"| {layer} | {previous:.3f} | {following:.3f} |")


if __name__ == "__main__":
    main()
