"""BertModel's forward pass on the real tokens only, for inference.

Padding is dropped once before the embeddings and put back once at the end (as MosaicML's
bert_layers and ModernBERT do): every linear layer, norm and GELU sees (tokens, hidden)
instead of (batch, seq, hidden). On the CPU the time is in those linear layers, so the
padding a batch carries is time saved one for one. The model does the work (its `packing`
argument); this is where inference hands it the packing its batcher made on the host. It lives
beside the model, not in engine/, because engine/ knows no model class.
"""
from __future__ import annotations

from ..engine.batching import TokenBatch
from .model import BertModel
from .outputs import EncoderOutput


def packed_forward(model: BertModel, batch: TokenBatch, output_hidden_states: bool = False) -> EncoderOutput:
    """The EncoderOutput of `model` on a batch, computed without padding.

    Real tokens get the same states as the padded forward pass; padded positions are zeros
    (the padded pass leaves values there that nothing should read). No attention maps.
    Nothing reads a value back from the device, so CUDA runs it without a host sync.
    """
    input_ids, token_type_ids, attention_mask = batch.tensors()
    return model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, packing=batch.packing,
                 output_hidden_states=output_hidden_states)
