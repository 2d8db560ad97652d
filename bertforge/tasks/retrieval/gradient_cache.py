"""A gradient cache (Gao et al. 2021, "GradCache"): in-batch negatives over a batch larger than memory.

An in-batch-negatives loss couples every vector of the batch, so the batch cannot simply be
split into accumulation steps (each would see fewer negatives). The cache splits only the
*encoder* work:
1. embed each mini-batch without autograd (one mini-batch of activations alive at a time),
   remembering the random state each started from;
2. compute the loss on those vectors as leaves and take its gradient w.r.t. each vector;
3. when the training loop calls `loss.backward()`, re-embed each mini-batch with autograd,
   replaying its random state (so dropout draws the same masks), and back-propagate the
   cached vector gradients (times the loop's upstream gradient, e.g. 1/accumulation).
The gradients equal those of the whole batch at once; the price is a second forward pass.
sentence-transformers' CachedMultipleNegativesRankingLoss does the same.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# (input_ids, attention_mask) of one column of texts (anchors, positives, ...), each (batch, seq).
Column = tuple[Tensor, Tensor]
Embed = Callable[[Tensor, Tensor], Tensor]


@dataclass
class RandomState:
    """The CPU (and CUDA) generator state at one moment, to run a forward pass again identically."""

    device: torch.device
    cpu: Tensor
    cuda: Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> "RandomState":
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(device, torch.get_rng_state(), cuda)

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Run the block from this state; the generators continue afterwards as if it never ran."""
        devices = [self.device] if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield


def mini_batches(column: Column, size: int) -> Iterator[Column]:
    """Slices of `size` rows, each cut to its own longest text (padding is on the right)."""
    input_ids, attention_mask = column
    for start in range(0, len(input_ids), size):
        mask = attention_mask[start:start + size]
        width = int(mask.sum(dim=1).max())
        yield input_ids[start:start + size, :width], mask[:, :width]


def cached_loss(embed: Embed, columns: Sequence[Column], loss_of: Callable[[list[Tensor]], Tensor],
                mini_batch_size: int) -> Tensor:
    """The loss of `loss_of(vectors of each column)`, with the gradient-cache backward attached.

    embed(input_ids, attention_mask) -> (rows, dim) vectors with autograd. Returns a scalar whose
    `.backward()` puts into the encoder's parameters the gradient of the whole-batch loss.
    """
    device = columns[0][0].device
    autocast = (torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
    states: list[list[RandomState]] = []
    leaves: list[Tensor] = []
    for column in columns:
        states.append([])
        parts = []
        for input_ids, attention_mask in mini_batches(column, mini_batch_size):
            states[-1].append(RandomState.capture(device))
            with torch.no_grad():
                parts.append(embed(input_ids, attention_mask))
        leaves.append(torch.cat(parts).detach().requires_grad_())
    with torch.enable_grad():
        loss = loss_of(leaves)
        gradients = torch.autograd.grad(loss, leaves, allow_unused=True)

    def replay(upstream: Tensor) -> None:
        enabled, dtype = autocast
        with torch.enable_grad(), torch.autocast(device.type, dtype=dtype, enabled=enabled):
            for column, column_states, gradient in zip(columns, states, gradients):
                if gradient is None:  # a column the loss does not use
                    continue
                start = 0
                for (input_ids, attention_mask), state in zip(mini_batches(column, mini_batch_size), column_states):
                    with state.replayed():
                        vectors = embed(input_ids, attention_mask)
                    part = gradient[start:start + len(vectors)] * upstream
                    start += len(vectors)
                    vectors.backward(part.to(vectors.dtype))

    result = loss.detach().requires_grad_()
    result.register_hook(replay)  # called with d(final)/d(loss) when the loop back-propagates
    return result
