"""Batches over a fixed set of examples: shuffled epochs for training, length-sorted for inference.

Fine-tuning data fits in memory as lists of token ids (one row per example or window);
a task supplies `collate(indices) -> dict of padded tensors` and these classes decide the
order. Both pretraining and fine-tuning streams report their position, so a resumed run
continues with the very next batch.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from ..engine.devices import to_device

Collate = Callable[[list[int]], dict[str, torch.Tensor]]


class ShuffledBatches:
    """Endless batches of `size` examples: a new permutation every epoch, seeded by (seed, epoch).

    The last batch of an epoch may be short (no example is dropped). state_dict() holds the
    epoch and the number of batches already given out in it.

    Under torchrun (world_size > 1) each optimizer step takes world_size x batch_size examples of the one
    permutation, and this process (`rank`) gets its own batch_size of them: an epoch is the examples once
    over all processes, in fewer steps. Every process gets a full batch at every step (the processes step
    together): the last step of an epoch fills up from the permutation's start.

    `batches_left_in_epoch` tells the loop where an epoch ends: with grad_accumulation an optimizer step ends at
    the epoch's last batch (transformers' Trainer's rule), so an epoch is one pass over the examples.
    """

    def __init__(self, size: int, batch_size: int, collate: Collate, seed: int = 0, rank: int = 0,
                 world_size: int = 1):
        if size < 1:
            raise ValueError("no training examples: check the data file and its columns")
        self.size, self.batch_size, self.collate, self.seed = size, batch_size, collate, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.batches_done = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return -(-self.size // (self.batch_size * self.world_size))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 10_007 + self.epoch))
            while self.batches_done < self.batches_per_epoch:
                indices = self.batch_indices(order, self.batches_done)
                self.batches_done += 1
                yield self.collate(indices)
            self.epoch, self.batches_done = self.epoch + 1, 0

    def batch_indices(self, order: torch.Tensor, step: int) -> list[int]:
        """This process's examples at `step` of the epoch whose permutation is `order`."""
        start = (step * self.world_size + self.rank) * self.batch_size
        if self.world_size == 1:
            return order[start:start + self.batch_size].tolist()
        return order[torch.arange(start, start + self.batch_size) % self.size].tolist()

    def batches_left_in_epoch(self, position: dict) -> int:
        """Batches from `position` (a state_dict()) to the end of the epoch that the next batch belongs to: all of
        a new epoch's at an epoch's end (or before any batch). The same on every process under torchrun."""
        done = position["batches_done"]
        return self.batches_per_epoch - done if done < self.batches_per_epoch else self.batches_per_epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches_done": self.batches_done}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batches_done = state["epoch"], state["batches_done"]


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> Iterator[list[int]]:
    """Indices in batches of similar length (longest first): little padding, so fast inference."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for start in range(0, len(order), batch_size):
        yield order[start:start + batch_size]


@torch.no_grad()
def predict_rows(model: torch.nn.Module, lengths: Sequence[int], collate: Collate, *, batch_size: int = 64,
                 outputs: Callable = lambda output: output.logits, per_token: bool = False,
                 device: torch.device = torch.device("cpu")) -> list:
    """Run `model` over every row and return its outputs as numpy arrays, one per row, in row order.

    `outputs(model_output)` picks the tensor to keep, or a tuple of them (QA's start and end
    logits; rows are then tuples too). With per_token, each (seq, ...) row is cut back to the
    row's own length, so padding never leaks into post-processing.
    """
    model.eval()
    rows: list = [None] * len(lengths)
    for indices in length_sorted_batches(lengths, batch_size):
        batch = to_device({key: value for key, value in collate(indices).items() if key != "labels"}, device)
        picked = outputs(model(**batch))
        tensors = picked if isinstance(picked, tuple) else (picked,)
        tensors = [t.float().cpu().numpy() for t in tensors]
        for position, index in enumerate(indices):
            values = tuple(t[position][:lengths[index]] if per_token else t[position] for t in tensors)
            rows[index] = values if isinstance(picked, tuple) else values[0]
    return rows
