"""Plain typed outputs, one per kind, with the Hugging Face field names.

They also index like HF's ModelOutput (`out[0]`, `out["logits"]`), skipping fields
that are None, so code written against `transformers` keeps working.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import Tensor

Tensors = tuple[Tensor, ...]


def hf_fields(output) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(output) if not f.metadata.get("part")]


class _Indexable:
    def to_tuple(self) -> tuple:
        return tuple(v for f in hf_fields(self) if (v := getattr(self, f.name)) is not None)

    def __getitem__(self, key: int | slice | str):
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def keys(self) -> list[str]:
        return [f.name for f in hf_fields(self) if getattr(self, f.name) is not None]


@dataclass
class EncoderOutput(_Indexable):
    last_hidden_state: Tensor  # (batch, seq, hidden)
    pooler_output: Tensor | None = None  # (batch, hidden)
    hidden_states: Tensors | None = None  # embeddings + one per layer, each (batch, seq, hidden)
    attentions: Tensors | None = None  # one per layer, each (batch, heads, seq, seq)


@dataclass
class PreTrainingOutput(_Indexable):
    loss: Tensor | None
    prediction_logits: Tensor  # (batch, seq, vocab), or (num_predictions, vocab) on the masked-only path
    seq_relationship_logits: Tensor  # (batch, 2)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None
    # The loss's parts (not in HF's output), so training statistics need not compute them again;
    # left out of to_tuple() and keys(), which keep HF's fields.
    mlm_loss: Tensor | None = dataclasses.field(default=None, metadata={"part": True})  # mean over masked tokens
    nsp_loss: Tensor | None = dataclasses.field(default=None, metadata={"part": True})  # mean over the batch


@dataclass
class ClassifierOutput(_Indexable):
    """Masked LM, next sentence, sequence and token classification: logits and their loss."""

    loss: Tensor | None
    logits: Tensor
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None


@dataclass
class QuestionAnsweringOutput(_Indexable):
    loss: Tensor | None
    start_logits: Tensor  # (batch, seq)
    end_logits: Tensor  # (batch, seq)
    hidden_states: Tensors | None = None
    attentions: Tensors | None = None
