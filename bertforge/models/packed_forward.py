"""BertModel's forward pass on the real tokens only, for inference.

Padding is dropped once before the embeddings and put back once at the end (as MosaicML's
bert_layers and ModernBERT do): every linear layer, norm and GELU sees (tokens, hidden)
instead of (batch, seq, hidden). On the CPU the time is in those linear layers, so the
padding a batch carries is time saved one for one. The model does the work (its `packing`
argument); this is where inference hands it the packing its batcher made on the host. It lives
beside the model, not in engine/, because engine/ knows no model class.
"""
from __future__ import annotations

import torch

from ..engine.batching import TokenBatch
from ..engine.precision import model_dtype
from ..engine.unpadding import PACKS_IN_INFERENCE, packing_pays
from .model import BertModel
from .outputs import EncoderOutput


def packed_forward(model: BertModel, batch: TokenBatch, output_hidden_states: bool = False,
                   only_if_it_pays: bool = False) -> EncoderOutput:
    """The EncoderOutput of `model` on a batch, computed without padding.

    Real tokens get the same states as the padded forward pass; padded positions are zeros
    (the padded pass leaves values there that nothing should read). No attention maps. On CUDA
    it runs the padded pass (engine.unpadding.PACKS_IN_INFERENCE: measured faster there), so
    padded positions hold values that mean nothing: every caller reads the real tokens only.
    Nothing reads a value back from the device, so CUDA runs it without a host sync.
    only_if_it_pays: run the padded pass instead where too little of the batch is padding for packing
    to pay on this device and in this dtype (engine.unpadding.packing_pays); padded positions then
    hold values that mean nothing, for callers that mask them (pooling).
    """
    input_ids, token_type_ids, attention_mask = batch.tensors()
    packing = batch.packing
    device = input_ids.device.type
    if not PACKS_IN_INFERENCE.get(device, True) or (
            only_if_it_pays and not packing_pays(batch.num_tokens, attention_mask.numel(), device,
                                                 int8=model_dtype(model) == torch.qint8)):
        packing = None
    return model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, packing=packing,
                 output_hidden_states=output_hidden_states)
