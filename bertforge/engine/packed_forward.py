"""BertModel's forward pass on the real tokens only, for inference.

Padding is dropped once after the embeddings and put back once at the end (as MosaicML's
bert_layers and ModernBERT do): every linear layer, norm and GELU sees (tokens, hidden)
instead of (batch, seq, hidden). On the CPU the time is in those linear layers, so the
padding a batch carries is time saved one for one.

Today's `BertModel.forward` unpads only in training; its layers already take the packed
layout (`Layer.forward(hidden_states, key_mask, token_indices)`), so this runs them in that
layout itself. When the model's forward takes a packing at inference (engine-train's
`packing=` argument), this function becomes that one call.
"""
from __future__ import annotations

from torch import Tensor

from ..models.model import BertModel, pad
from ..models.outputs import EncoderOutput
from .batching import TokenBatch


def packed_forward(model: BertModel, batch: TokenBatch, output_hidden_states: bool = False) -> EncoderOutput:
    """The EncoderOutput of `model` on a batch, computed without padding.

    Real tokens get the same states as the padded forward pass; padded positions are zeros
    (the padded pass leaves values there that nothing should read). No attention maps.
    Nothing reads a value back from the device, so CUDA runs it without a host sync.
    """
    input_ids, token_type_ids, attention_mask, token_indices = batch.tensors()
    rows, width = input_ids.shape

    def packed(tensor: Tensor) -> Tensor:  # (batch, seq) -> (tokens,)
        return tensor.flatten().index_select(0, token_indices)

    hidden_states = model.embeddings(packed(input_ids), packed(token_type_ids), token_indices % width)
    key_mask = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, seq) for the attention itself
    all_hidden_states = [hidden_states]
    for layer in model.encoder.layer:
        hidden_states, _ = layer(hidden_states, key_mask, token_indices)  # (tokens, hidden)
        all_hidden_states.append(hidden_states)

    def padded(states: Tensor) -> Tensor:
        return pad(states, token_indices, rows, width)

    last_hidden_state = padded(hidden_states)
    return EncoderOutput(
        last_hidden_state=last_hidden_state,
        pooler_output=model.pooler(last_hidden_state) if model.pooler is not None else None,
        hidden_states=tuple(padded(states) for states in all_hidden_states) if output_hidden_states else None,
    )
