"""Padding removed once at the top of the encoder and put back once at the end.

A `Packing` describes where the real tokens of a padded (batch, seq) batch are: their flat
positions, the cumulative sequence lengths (which the CPU's length-grouped attention reads), and
the padded shape. It is made on the host from the attention mask the collator produced, before
the batch moves to the device, so the forward pass never asks the device for a number
(`.item()`, `nonzero`) and `torch.compile(fullgraph=True)` can trace it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

# Below this share of padding, packing costs more than it saves. Measured on BERT-mini (CPU, fp32):
# unpadding won ~7% of a step at 10% padding, ~28% at 28%, and broke even near 4%. CUDA, an H200,
# pretraining steps at ~20% padding (benchmarks/bench_pretrain.py, batch 32 x 128, masked-only head):
# BERT-base packed 0.052 s a step against 0.060 padded in fp32, 0.035 against 0.036 in bf16; BERT-mini
# the same in fp32 (0.008), slower in bf16 (0.027 against 0.018: a step that small waits on the host).
MIN_PADDING_TO_PACK = {"cpu": 0.05, "cuda": 0.0}
# Inference on CUDA runs padded: on an H200 (all-MiniLM-L6-v2, 4,000 Emma lines, batch 128) the packed
# pass gave 11,379 texts/s in fp32 and 3,360 in fp16, the padded one 15,032 and 10,442. A forward pass
# of a small encoder there waits on the host's kernel launches, and packing adds launches.
PACKS_IN_INFERENCE = {"cpu": True, "cuda": False}
# int8 on the CPU: its linear layers cost a third of float32's while the copies around attention cost the
# same. all-MiniLM-L6-v2, 500 real texts, 1 thread, batch by batch: the padded pass was 12% faster at 11%
# padding, even at 16%, slower from 20%.
INT8_MIN_PADDING_TO_PACK = 0.15


@dataclass
class Packing:
    """The real tokens of a padded batch, for the packed (tokens, ...) layout.

    token_indices: (tokens,) int64 flat positions in (batch * seq), row-major.
    cu_seqlens: (batch + 1,) int32 cumulative real lengths: row r's tokens are packed
        rows cu_seqlens[r]:cu_seqlens[r + 1].
    key_mask: (batch, 1, 1, seq) bool, True at real tokens: the padded attention's mask, for the
        kernel that runs packed inputs through the padded layout ("repadded").
    batch_size, seq_len: host ints, the padded shape `pad` restores.
    """

    token_indices: Tensor
    cu_seqlens: Tensor
    key_mask: Tensor
    batch_size: int
    seq_len: int

    @classmethod
    def from_attention_mask(cls, attention_mask: Tensor) -> "Packing":
        """(batch, seq) 1/0 mask -> Packing. Call it on the host: it reads the mask's values."""
        real = attention_mask.bool()
        lengths = real.sum(dim=1)
        cu_seqlens = torch.zeros(real.size(0) + 1, dtype=torch.int32, device=real.device)
        cu_seqlens[1:] = lengths.cumsum(0)
        return cls(token_indices=real.flatten().nonzero().squeeze(1), cu_seqlens=cu_seqlens,
                   key_mask=real[:, None, None, :], batch_size=real.size(0), seq_len=real.size(1))

    @property
    def num_tokens(self) -> int:
        return self.token_indices.numel()

    @functools.cached_property
    def length_groups(self) -> "LengthGroups":
        """The sequences grouped by length (see LengthGroups); reads cu_seqlens, so for host-side kernels only."""
        bounds = self.cu_seqlens.tolist()
        lengths = [end - start for start, end in zip(bounds, bounds[1:])]
        runs, rows = equal_length_runs(lengths)
        if rows is None:
            return LengthGroups(runs, None)
        starts = torch.tensor([bounds[r] for r in rows], dtype=torch.int64)
        sizes = torch.tensor([lengths[r] for r in rows], dtype=torch.int64)
        shift = torch.repeat_interleave(starts - (sizes.cumsum(0) - sizes), sizes)  # packed row - grouped row
        return LengthGroups(runs, torch.arange(int(sizes.sum())) + shift)

    def to(self, device: torch.device, non_blocking: bool = False) -> "Packing":
        move = lambda tensor: tensor.to(device, non_blocking=non_blocking)
        return Packing(move(self.token_indices), move(self.cu_seqlens), move(self.key_mask), self.batch_size,
                       self.seq_len)

    def pin_memory(self) -> "Packing":
        return Packing(self.token_indices.pin_memory(), self.cu_seqlens.pin_memory(), self.key_mask.pin_memory(),
                       self.batch_size, self.seq_len)


@dataclass(frozen=True)
class LengthGroups:
    """A Packing's sequences with equal lengths side by side: attention runs on each group unpadded.

    runs: (sequences, length) per group, in the grouped order (empty sequences left out).
    order: (tokens,) int64, the packed rows in the grouped order; None when equal lengths are already
        adjacent (a batch sorted by length, as the inference planner makes them).
    """

    runs: tuple[tuple[int, int], ...]
    order: Tensor | None

    @functools.cached_property
    def restore(self) -> Tensor:
        """(tokens,) int64, the grouped rows in the packed order: `order` undone by a gather, which on the CPU
        took a third of the time of scattering back with index_copy (1,300 tokens of 12 x 32)."""
        restore = torch.empty_like(self.order)
        restore[self.order] = torch.arange(self.order.numel())
        return restore


def equal_length_runs(lengths: list[int]) -> tuple[tuple[tuple[int, int], ...], list[int] | None]:
    """Runs of equal length as (count, length), and the row order that makes them (None: the given one).

    Rows keep their order where equal lengths are already adjacent; otherwise they are sorted by
    length, longest first (stable). Empty rows are left out of the runs.
    """
    def runs_of(rows):
        runs: list[list[int]] = []
        for row in rows:
            if lengths[row] == 0:
                continue
            if runs and runs[-1][1] == lengths[row]:
                runs[-1][0] += 1
            else:
                runs.append([1, lengths[row]])
        return tuple((count, length) for count, length in runs)

    runs = runs_of(range(len(lengths)))
    if len(runs) == len({length for length in lengths if length}):
        return runs, None
    rows = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    return runs_of(rows), rows


def packing_pays(num_tokens: int, padded_size: int, device_type: str, int8: bool = False) -> bool:
    """Whether a batch of num_tokens real tokens in padded_size positions runs faster packed on `device_type`."""
    padding = (padded_size - num_tokens) / max(1, padded_size)
    # Every threshold is >= 0, so no padding never packs.
    return padding > (INT8_MIN_PADDING_TO_PACK if int8 else MIN_PADDING_TO_PACK.get(device_type, 0.0))


def packing_if_it_pays(attention_mask: Tensor, device_type: str) -> Packing | None:
    """A Packing when enough of the batch is padding to pay on `device_type`, else None (stay padded).

    attention_mask: (batch, seq) on the host.
    """
    real = attention_mask.bool()
    if not packing_pays(int(real.sum()), real.numel(), device_type):
        return None
    return Packing.from_attention_mask(real)


def unpad(states: Tensor, packing: Packing) -> Tensor:
    """(batch, seq, ...) -> (tokens, ...): the real tokens alone, in row-major order."""
    return states.flatten(0, 1).index_select(0, packing.token_indices)


def pad(states: Tensor, packing: Packing) -> Tensor:
    """(tokens, ...) -> (batch, seq, ...) with zeros at the padded positions: `unpad` undone."""
    padded = states.new_zeros(packing.batch_size * packing.seq_len, *states.shape[1:])
    padded.index_copy_(0, packing.token_indices, states)  # in place: index_copy would copy the zeros again first
    return padded.view(packing.batch_size, packing.seq_len, *states.shape[1:])
