"""A BERT decoder over an encoder's own weights: what TSDAE (Wang et al. 2021) trains a sentence encoder with.

The decoder runs the encoder's BertModel again, causally (a token sees only those before it), with
a cross-attention block after each layer's self-attention that attends to `memory` (TSDAE: the
sentence vector, (batch, 1, hidden)), and scores the next token with the MLM head. Every weight but
the cross-attention blocks and the head is the encoder's own: sentence-transformers'
tie_encoder_decoder, the paper's setting. So the decoder owns only those, and the encoder stays a
plain BertModel (its outputs and parameter names are untouched). The computation is transformers'
BertLMHeadModel(is_decoder=True, add_cross_attention=True) fed encoder_hidden_states=memory
(tests/test_tsdae.py compares them).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from .checkpoint import check_shapes, match_keys, read_state_dict
from .initialisation import init_bert_weights
from .heads import PreTrainingHeads, masked_lm
from .model import Attention, BertModel


class BertDecoder(nn.Module):
    """Cross-attention blocks (`crossattention.N`, one per encoder layer) and the MLM head (`cls.predictions`,
    its output matrix the encoder's word embeddings); `forward` runs them with the encoder's layers."""

    tied_keys = ("cls.predictions.decoder.weight",)  # the encoder's word embeddings: its state, not ours

    def __init__(self, bert: BertModel):
        super().__init__()
        config = bert.config
        self.crossattention = nn.ModuleList(Attention(config) for _ in range(config.num_hidden_layers))
        self.cls = PreTrainingHeads(config, bert.embeddings.word_embeddings, next_sentence=False)
        # Not the head's output matrix: it is the encoder's embedding, already trained.
        init_bert_weights([*self.crossattention.modules(), *self.cls.predictions.transform.modules()],
                          config.initializer_range)

    def forward(self, bert: BertModel, input_ids: Tensor, memory: Tensor, labels: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """input_ids (batch, seq), memory (batch, memory_seq, hidden) -> (scores, loss).

        Position t scores the token at t + 1 from the tokens up to t and the memory. Without labels the
        scores are (batch, seq, vocab); with labels (batch, seq: the next token's id, -100 where none
        counts) only the labelled positions are scored, (labelled, vocab), and the loss is their mean
        cross-entropy (`heads.masked_lm`).
        """
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        states = bert.embeddings(input_ids, torch.zeros_like(input_ids), positions)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=input_ids.device).tril()[None, None]
        for layer, crossattention in zip(bert.encoder.layer, self.crossattention):
            attended, _ = layer.attention(states, causal, None, False)
            crossed, _ = crossattention(attended, None, None, False, memory=memory)
            states = layer.feed_forward(crossed)
        return masked_lm(self.cls.predictions, states, labels, masked_only=labels is not None)

    def load_head(self, folder: str | Path) -> bool:
        """The MLM head of a checkpoint folder that has one (a BertForMaskedLM's), in place of the fresh one;
        returns whether it had one. A sentence encoder's folder has none: the head stays as drawn."""
        weights_file, state = read_state_dict(Path(folder))
        head = {key: tensor for key, tensor in match_keys(state, self)[0].items() if key.startswith("cls.")}
        if not head:
            return False
        check_shapes(head, self, weights_file)
        self.load_state_dict(head, strict=False)
        return True

    def own_state_dict(self) -> dict[str, Tensor]:
        """The weights the decoder adds to the encoder (cross-attention, head transform, bias)."""
        return {key: value for key, value in self.state_dict().items() if key not in self.tied_keys}
