"""Token states -> one vector per text.

Each function takes (batch, seq, dim) token states and the (batch, seq) 1/0 attention mask
and returns (batch, dim); padded positions never count.
"""
from __future__ import annotations

from typing import Literal, get_args

from torch import Tensor

Pooling = Literal["cls", "mean", "max", "pooler"]
POOLINGS = get_args(Pooling)
# The poolings a sentence-transformers folder can name (1_Pooling/config.json): what search and
# serving accept, since their vectors must be reproducible from the folder alone.
SentencePooling = Literal["cls", "mean", "max"]


def cls_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    return states[:, 0]


def mean_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over real tokens, written as sentence-transformers' Pooling(mean) so vectors match it."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def max_pool(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Element-wise max over real tokens; padding is -inf so it never wins."""
    padding = attention_mask.unsqueeze(-1) == 0
    return states.masked_fill(padding, float("-inf")).max(dim=1).values


POOL_FUNCTIONS = {"cls": cls_pool, "mean": mean_pool, "max": max_pool}
