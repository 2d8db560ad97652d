"""Token states -> one vector per text.

Each function takes (batch, seq, dim) token states and the (batch, seq) 1/0 attention mask
(padding on the right) and returns (batch, dim); padded positions never count. The modes are
sentence-transformers' Pooling modes, written as its `_forward_padded` computes them, so a
folder's vectors match its own; "mean+cls" (modes joined by "+") concatenates their vectors in the order
named, as ST 6's `Pooling(pooling_mode=["mean", "cls"])` does (`pooling_modes`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..models.folder import POOLING_JOIN


def cls_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    return states[:, 0]


def mean_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens, written as sentence-transformers' Pooling(mean) so vectors match it."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def mean_sqrt_len_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """The sum over real tokens divided by the square root of their number (ST's mean_sqrt_len_tokens)."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9).sqrt()


def weighted_mean_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens weighted by position 1, 2, ... (ST's weightedmean, as SGPT uses)."""
    weights = torch.arange(1, states.shape[1] + 1, device=states.device, dtype=states.dtype).view(1, -1, 1)
    weighted_mask = attention_mask.unsqueeze(-1).to(states.dtype) * weights
    return (states * weighted_mask).sum(dim=1) / weighted_mask.sum(dim=1).clamp(min=1e-9)


def last_token_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """The last real token's state ([SEP] for BERT inputs)."""
    last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
    return states[torch.arange(states.shape[0], device=states.device), last]


def max_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Element-wise max over real tokens; padding is -inf so it never wins."""
    padding = attention_mask.unsqueeze(-1) == 0
    return states.masked_fill(padding, float("-inf")).max(dim=1).values


POOL_FUNCTIONS = {"cls": cls_pool, "mean": mean_pool, "max": max_pool, "mean_sqrt_len_tokens": mean_sqrt_len_pool,
                  "weightedmean": weighted_mean_pool, "lasttoken": last_token_pool}


def pooling_modes(pooling: str) -> tuple[str, ...]:
    """"mean+cls" -> ("mean", "cls"): the modes, in the order their vectors are concatenated, which is the order
    named, as sentence-transformers 6 concatenates its Pooling(pooling_mode=[...]) list. This order is the only one:
    a folder's Pooling is read into it in the order ST gives that file (`models.folder.read_pooling`: its pre-6
    booleans in ST's fixed order, "cls+mean"; a 6.x list as listed), and written back in a format ST reads in the
    same order (`models.folder.pooling_config`), so what trains, what is saved and what ST and bertforge read back
    agree. ValueError naming the valid modes for an unknown one."""
    modes = tuple(pooling.split(POOLING_JOIN)) if isinstance(pooling, str) else (pooling,)
    unknown = [mode for mode in modes if mode not in POOL_FUNCTIONS]
    if unknown:
        common, others = ("cls", "mean", "max", "pooler"), tuple(m for m in POOL_FUNCTIONS if m not in ("cls", "mean", "max"))
        raise ValueError(f"pooling={pooling!r} is not one of {common}, sentence-transformers' {others}, "
                         f"nor modes joined by {POOLING_JOIN!r} (e.g. 'cls{POOLING_JOIN}mean')")
    return modes


def pool(states: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """(batch, seq, dim) states -> (batch, dim x number of modes): each mode's vector, concatenated in order."""
    modes = pooling_modes(pooling)
    if len(modes) == 1:
        return POOL_FUNCTIONS[modes[0]](states, attention_mask)
    return torch.cat([POOL_FUNCTIONS[mode](states, attention_mask) for mode in modes], dim=-1)
