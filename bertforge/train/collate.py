"""The one collator: rows of token ids (any task) into right-padded (batch, seq) tensors.

Every task batches the same way: input_ids padded with [PAD], token_type_ids with 0, token-level
labels with -100 (ignored by the losses), attention_mask 1 on real tokens; per-row fields
(a class label, answer start/end, next-sentence label) are stacked as they are.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..models.heads import IGNORE_INDEX


def pad_rows(sequences: Mapping[str, Sequence[Sequence[int]]], pad_token_id: int, *,
             row_fields: Mapping[str, torch.Tensor | Sequence] | None = None,
             pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """One batch from per-row sequences (`input_ids` required; `token_type_ids`, token `labels` optional).

    sequences: name -> one list/array of ints per row; every name is padded to the longest
    input_ids row (or to pad_to): input_ids with pad_token_id, labels with -100, others with 0.
    attention_mask (batch, seq) is made from the lengths. row_fields: name -> one value per
    row (batch, ...), passed through as int64 tensors. Raises ValueError for an empty batch
    or a row longer than pad_to.
    """
    input_ids = sequences["input_ids"]
    if len(input_ids) == 0:
        raise ValueError("cannot collate an empty batch; give at least one row")
    lengths = [len(row) for row in input_ids]
    longest = max(lengths)
    if pad_to is not None and longest > pad_to:
        raise ValueError(f"a row has {longest} tokens, more than pad_to={pad_to}; raise pad_to or "
                         "make rows with a smaller max_seq_length")
    shape = (len(input_ids), pad_to or longest)
    batch = {}
    for name, rows in sequences.items():
        value = pad_token_id if name == "input_ids" else IGNORE_INDEX if name == "labels" else 0
        padded = torch.full(shape, value, dtype=torch.long)
        for row, (ids, size) in enumerate(zip(rows, lengths)):
            padded[row, :size] = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        batch[name] = padded
    batch["attention_mask"] = (torch.arange(shape[1])[None, :] < torch.tensor(lengths)[:, None]).long()
    for name, values in (row_fields or {}).items():
        batch[name] = torch.as_tensor(values, dtype=torch.long) if not isinstance(values, torch.Tensor) else values
    return batch
