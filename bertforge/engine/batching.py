"""Batches filled up to a token budget, as text-embeddings-inference fills them.

Texts are sorted by token count, longest first, and each batch takes texts until one more
would push its padded size (texts x its longest text) past `max_tokens`, or its count past
`max_texts`. Sorting makes neighbours nearly the same length, so the padded size is close to
the real token count and a budget in tokens bounds the activations' memory whatever the
mix of lengths: a batch of tweets holds many texts, a batch of long paragraphs few.

Everything here runs on the host, before a batch moves to the device: the positions of the
real tokens are computed once from lengths the tokenizer already knows, so the forward pass
never asks the device for a number.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .unpadding import Packing


# Texts tokenized (and length-sorted) together (`tokenize_windows`): large enough that sorting removes nearly
# all padding, small enough that a window's token lists stay a few MB.
TOKENIZE_WINDOW = 4096
# The first window is smaller, so that the first passes start while the rest is tokenized: on an H200, 2,000
# texts ran 3% faster at batch 32 and 128 (interleaved runs; scripts/results/gpu_h200_2026-11-26c.md); the CPU
# measured level.
FIRST_TOKENIZE_WINDOW = 256


def plan_batches(lengths: Sequence[int] | np.ndarray, max_tokens: int, max_texts: int | None = None, *,
                 count_padding: bool = True) -> list[np.ndarray]:
    """Row indices of each batch, longest texts first; every row appears exactly once.

    lengths: token count of each text, (n,). A batch of k texts whose longest has L tokens
    is padded to k * L <= max_tokens (a text longer than max_tokens alone forms a batch: cut it
    first with `fit_to_budget`), and k <= max_texts when given.
    count_padding=False bounds the batch's real tokens (the sum of its lengths) instead: for a
    packed forward pass with length-grouped attention (`engine.attention`), where padding costs
    no time, and whose caller bounds the padded size some other way (the server's batcher does).
    Returns int64 arrays; [] for no texts.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")  # stable: equal lengths keep input order
    real_ends = np.cumsum(lengths[order])  # real tokens of order[:i + 1]
    batches, start = [], 0
    while start < len(order):
        if count_padding:
            count = max(1, max_tokens // max(1, int(lengths[order[start]])))
        else:
            before = int(real_ends[start - 1]) if start else 0
            count = max(1, int(np.searchsorted(real_ends, before + max_tokens, side="right")) - start)
        if max_texts is not None:
            count = min(count, max_texts)
        batches.append(order[start:start + count])
        start += count
    return batches


def tokenize_windows(count: int) -> list[tuple[int, int]]:
    """[(start, end)] of the windows of `count` texts that are tokenized, length-sorted and batched together
    (`Embedder.batches`): FIRST_TOKENIZE_WINDOW texts, then TOKENIZE_WINDOW at a time."""
    bounds, size = [0], FIRST_TOKENIZE_WINDOW
    while bounds[-1] < count:
        bounds.append(min(count, bounds[-1] + size))
        size = TOKENIZE_WINDOW
    return [(start, end) for start, end in zip(bounds, bounds[1:])]

def fit_to_budget(token_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Cut sequences longer than max_tokens to max_tokens, keeping their last token ([SEP]); warn once.

    A batch can never be smaller than one text, so a text past the budget would break it;
    cutting it is what the tokenizer's own truncation would have done at that length.
    """
    too_long = [i for i, ids in enumerate(token_ids) if len(ids) > max_tokens]
    if not too_long:
        return token_ids
    warnings.warn(
        f"{len(too_long)} text(s) (the first at position {too_long[0]}) are longer than max_batch_tokens="
        f"{max_tokens} and were truncated to {max_tokens} tokens; raise max_batch_tokens to keep them whole",
        stacklevel=3,
    )
    fitted = list(token_ids)
    for i in too_long:
        fitted[i] = fitted[i][:max_tokens - 1] + fitted[i][-1:]
    return fitted


@dataclass
class TokenBatch:
    """Texts padded on the right to the batch's longest, and where their real tokens are.

    rows: (batch,) int64, each text's position in the caller's input.
    input_ids, token_type_ids, attention_mask: (batch, seq) int64.
    packing: where the real tokens are (engine.unpadding.Packing), made on the host so that the
        model's packed forward pass reads nothing back from the device.
    """

    rows: np.ndarray
    input_ids: Tensor
    token_type_ids: Tensor
    attention_mask: Tensor
    packing: Packing

    @classmethod
    def from_padded(cls, batch: dict, rows: np.ndarray | None = None) -> "TokenBatch":
        """A padded tokenizer output (input_ids, attention_mask[, token_type_ids]) on the host."""
        mask = batch["attention_mask"].cpu()
        input_ids = batch["input_ids"]
        token_type_ids = batch.get("token_type_ids")
        return cls(rows=np.arange(len(input_ids)) if rows is None else rows, input_ids=input_ids,
                   token_type_ids=torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids,
                   attention_mask=batch["attention_mask"], packing=Packing.from_attention_mask(mask))

    @property
    def num_tokens(self) -> int:
        return self.packing.num_tokens

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.input_ids, self.token_type_ids, self.attention_mask

    def pin_memory(self) -> "TokenBatch":
        """Page-locked host copies, so that `to(cuda, non_blocking=True)` overlaps with compute."""
        return TokenBatch(self.rows, *(tensor.pin_memory() for tensor in self.tensors()), self.packing.pin_memory())

    def to(self, device: torch.device, non_blocking: bool = False) -> "TokenBatch":
        return TokenBatch(self.rows, *(tensor.to(device, non_blocking=non_blocking) for tensor in self.tensors()),
                          self.packing.to(device, non_blocking=non_blocking))


def collate(token_ids: Sequence[Sequence[int]], rows: np.ndarray, pad_token_id: int) -> TokenBatch:
    """The texts token_ids[r] for r in rows -> one TokenBatch (single texts: token types all 0)."""
    sequences = [token_ids[r] for r in rows]
    lengths = np.fromiter((len(ids) for ids in sequences), dtype=np.int64, count=len(sequences))
    width = int(lengths.max())
    real = np.arange(width)[None, :] < lengths[:, None]  # (batch, seq)
    input_ids = np.full(real.shape, pad_token_id, dtype=np.int64)
    input_ids[real] = np.concatenate(sequences)  # boolean assignment fills row-major: each row's ids in order
    attention_mask = torch.from_numpy(real.astype(np.int64))
    return TokenBatch(rows=np.asarray(rows, dtype=np.int64), input_ids=torch.from_numpy(input_ids),
                      token_type_ids=torch.zeros(real.shape, dtype=torch.int64), attention_mask=attention_mask,
                      packing=Packing.from_attention_mask(attention_mask))
