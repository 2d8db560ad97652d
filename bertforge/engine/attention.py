"""Scaled dot-product attention: the one place the attention math lives.

`attention` takes query/key/value either padded, (batch, seq, heads, head_size) with a key
mask, or packed, (tokens, heads, head_size) with a `Packing` (the real tokens of the batch,
back to back). Packed inputs go to one of two kernels:
  - "repadded": back to (batch, seq) for SDPA and packed again, around attention alone (the linear
    layers, norms and GELU still see only the real tokens). CUDA, and the CPU in training and under
    torch.compile, where one call per batch keeps the graph's shape. On an H200 (BERT-mini and
    BERT-base pretraining steps, batch 32 x 128, 10-30% padding) it beat both variable-length kernels
    torch offers: SDPA on jagged nested tensors took 3-5x as long (a Python tensor subclass: 70% of
    the host's time, the GPU busy 6%), and `varlen_attn` (bf16 only, no dropout) 1.04-1.25x;
  - "length_grouped": one call per group of equal-length sequences, each group a plain
    (sequences, heads, length, d) view with no padding and no mask (the CPU, inference: a server's
    batch of 16 texts of mixed lengths ran 1.25-1.4x faster than "repadded", all-MiniLM-L6-v2,
    1 thread; the fused CPU kernel is much slower with a mask than without). Short groups skip the
    fused kernel for two matmuls (`short_attention`, up to SHORT_ATTENTION_MAX_LENGTH tokens).
Neither reads a value from the device (`length_grouped` reads the lengths from the host's Packing).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .unpadding import Packing, pad, unpad


def attention(query: Tensor, key: Tensor, value: Tensor, *, key_mask: Tensor | None = None,
              packing: Packing | None = None, dropout_p: float = 0.0,
              return_probs: bool = False) -> tuple[Tensor, Tensor | None]:
    """Multi-head attention of every query over the keys of its own sequence.

    Padded: query/key/value (batch, seq, heads, head_size); key_mask bool (batch, 1, 1, seq),
    True where a key may be attended to, or None when nothing is padded. A decoder's masks fit too:
    (1, 1, seq, seq) causal, and keys and values of another length (cross-attention to memory).
    Packed (packing given): query/key/value (tokens, heads, head_size).
    Returns the context in the layout of `query` and, when asked for (padded only), the
    probabilities (batch, heads, seq, seq).
    """
    if packing is not None:
        if return_probs:
            raise ValueError("attention probabilities need the padded layout: call without packing")
        return PACKED_KERNELS[packed_kernel(query, dropout_p)](query, key, value, packing, dropout_p), None
    context, probs = padded_attention(*(t.transpose(1, 2) for t in (query, key, value)), key_mask, dropout_p,
                                      return_probs)
    return context.transpose(1, 2), probs  # (batch, seq, heads, head_size)


def padded_attention(query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, dropout_p: float,
                     return_probs: bool) -> tuple[Tensor, Tensor | None]:
    """SDPA on (batch, heads, seq, head_size); the probabilities, which the fused kernel hides, spelled out."""
    if not return_probs:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout_p), None
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.size(-1))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    return F.dropout(probs, dropout_p) @ value, probs


def packed_kernel(query: Tensor, dropout_p: float = 0.0) -> str:
    """Which packed kernel serves these inputs (see the module docstring)."""
    # Grouping depends on the batch's lengths (a compiled graph would be re-traced for each batch), and
    # runs one SDPA call per group: on the CPU in inference only. A no-grad pass that drops attention out is
    # training's (the gradient cache's first pass): it must draw the masks the pass with gradients redraws.
    inference = not torch.is_grad_enabled() and not torch.compiler.is_compiling() and not dropout_p
    return "length_grouped" if query.device.type == "cpu" and inference else "repadded"


def repadded_attention(query: Tensor, key: Tensor, value: Tensor, packing: Packing, dropout_p: float) -> Tensor:
    padded = (pad(states, packing).transpose(1, 2) for states in (query, key, value))  # (batch, heads, seq, d)
    context, _ = padded_attention(*padded, packing.key_mask, dropout_p, return_probs=False)
    return unpad(context.transpose(1, 2), packing)


# The longest sequence `length_grouped_attention` gives to `short_attention` rather than the fused kernel. The fused
# CPU kernel works in blocks of queries and keys sized for long sequences; on a few dozen tokens with 32-wide heads its
# set-up dominates (a group of 32 sequences of 12 tokens: 1.1 ms at 1 thread, 1.9 ms at 2; two matmuls 0.7 and 0.5
# ms). The 1,000 mixed texts of benchmarks/bench_inference.py (93% under 64 tokens), all-MiniLM-L6-v2's 6 layers, the
# AMD EPYC (AVX2): attention alone 0.93-1.10 s -> 0.86-0.89 at 1 thread with matmuls up to 32 tokens (longer groups
# were slower); at 2 threads in one process 0.93-1.00 s -> 0.51-0.81 with matmuls up to 64 (a long encode runs
# single-threaded workers instead: engine/workers.py). One length whatever the thread count: the two kernels round
# differently, and a limit that was 64 at 2 threads (until 2026-11-28) made a text's vector change in its last bits
# with the count the governor chose, so a resumed build or embed was not the uninterrupted one's. On the VNNI Xeon
# 32 and 64 ran level at 1 and 2 threads (167 / 168 and 300 / 300 texts/s, five interleaved runs of 1,000 texts in
# calls of 32), and so they did with its kernels limited to AVX2 (98 / 97 and 178 / 176).
SHORT_ATTENTION_MAX_LENGTH = 32


def short_attention(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """Attention on (sequences, heads, length, d) without a mask or dropout, as matmuls: for short sequences."""
    query, key, value = (t.contiguous() for t in (query, key, value))  # strided views slow the batched matmul
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(query.size(-1) ** -0.5)
    return torch.matmul(scores.softmax(dim=-1), value)


def length_grouped_attention(query: Tensor, key: Tensor, value: Tensor, packing: Packing, dropout_p: float) -> Tensor:
    groups = packing.length_groups
    if groups.order is not None:
        query, key, value = (t.index_select(0, groups.order) for t in (query, key, value))
    contexts, start = [], 0
    for count, length in groups.runs:
        end = start + count * length
        grouped = [t[start:end].unflatten(0, (count, length)).transpose(1, 2) for t in (query, key, value)]
        if length <= SHORT_ATTENTION_MAX_LENGTH and not dropout_p:
            context = short_attention(*grouped)
        else:
            context = F.scaled_dot_product_attention(*grouped, dropout_p=dropout_p)  # (count, heads, length, d)
        contexts.append(context.transpose(1, 2).flatten(0, 1))
        start = end
    if not contexts:  # only empty sequences
        return torch.zeros_like(query)
    context = contexts[0] if len(contexts) == 1 else torch.cat(contexts)
    if groups.order is not None:  # back to the packed order
        context = context.index_select(0, groups.restore)
    return context


PACKED_KERNELS = {"repadded": repadded_attention, "length_grouped": length_grouped_attention}
