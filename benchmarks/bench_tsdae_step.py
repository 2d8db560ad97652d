"""Seconds per TSDAE training step (forward, backward, AdamW) on real text, beside an ICT step and
sentence-transformers' DenoisingAutoEncoderLoss on the same batches.

    OMP_NUM_THREADS=1 python benchmarks/bench_tsdae_step.py /work/shared/data/austen/emma.txt \
        [--passages 400] [--batch-size 16] [--steps 5] [--model minilm] [--rows ours,passages,ict,st]

Rows: `ours` TSDAE on the corpus's sentences (what adapt trains on), `passages` TSDAE on whole
passages, `ict` an in-batch ICT step (adapt's quick preset), `st` sentence-transformers' loss on the
`ours` batches. Each row: one warm-up step, then the median of --steps timed steps, and the mean real
tokens per text of the (original) batch.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from bertforge.search.documents import read_corpus
from bertforge.adapt.ict import IctCollator, training_passages
from bertforge.adapt.methods import tsdae_sentences
from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.bi_encoder import BiEncoder, Objective
from bertforge.tasks.retrieval.denoising import DenoisingAutoEncoder, DenoisingCollator
from bertforge.tokenization.tokenizer import BertTokenizer
from bertforge.train.optim import build_optimizer


def timed_steps(step, batches) -> list[float]:
    times = []
    for batch in batches:
        started = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - started)
    return times[1:]  # the first is a warm-up


def ours_step(model):
    optimizer = build_optimizer(model, 3e-5)
    model.train()

    def step(batch):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def st_step(folder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss

    loss = DenoisingAutoEncoderLoss(SentenceTransformer(str(folder), device="cpu"), tie_encoder_decoder=True)
    optimizer = torch.optim.AdamW(loss.parameters(), lr=3e-5)
    loss.train()

    def step(batch):
        features = [{"input_ids": batch["noisy_input_ids"], "attention_mask": batch["noisy_attention_mask"]},
                    {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}]
        loss(features, None).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", nargs="+")
    parser.add_argument("--passages", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--rows", default="ours,passages,ict,st")
    args = parser.parse_args()
    folder = resolve_model(args.model)
    tokenizer = BertTokenizer.from_pretrained(folder)
    passages = read_corpus(args.corpus).passages[:args.passages]
    sentences, texts = tsdae_sentences(passages), [p.text for p in passages]
    print(f"{len(passages)} passages, {len(sentences)} sentences of >= 5 words; batch {args.batch_size}, "
          f"{torch.get_num_threads()} thread(s), {args.model}")
    order = np.random.default_rng(0).permutation
    count = args.steps + 1

    def batches(collate, size):
        indices = order(size)[:count * args.batch_size].reshape(count, args.batch_size)
        return [collate(row.tolist()) for row in indices]

    tsdae = batches(DenoisingCollator(sentences, tokenizer, 256), len(sentences))
    rows = {
        "ours": lambda: (ours_step(DenoisingAutoEncoder.from_pretrained(folder)), tsdae),
        "passages": lambda: (ours_step(DenoisingAutoEncoder.from_pretrained(folder)),
                             batches(DenoisingCollator(texts, tokenizer, 256), len(texts))),
        "ict": lambda: (ours_step(BiEncoder.from_pretrained(folder, objective=Objective(symmetric=True))),
                        batches(IctCollator(passages, training_passages(passages), tokenizer, 256),
                                len(training_passages(passages)))),
        "st": lambda: (st_step(folder), tsdae),
    }
    for name in args.rows.split(","):
        step, data = rows[name]()
        mask = "attention_mask" if "attention_mask" in data[0] else "positive_attention_mask"
        tokens = np.mean([b[mask].sum().item() / len(b[mask]) for b in data])
        times = timed_steps(step, data)
        print(f"{name:9s} {statistics.median(times):6.2f} s/step (min {min(times):.2f}, max {max(times):.2f}), "
              f"{tokens:.0f} tokens per text", flush=True)


if __name__ == "__main__":
    main()
