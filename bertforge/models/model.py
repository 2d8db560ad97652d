"""The BERT encoder, top to bottom as in the paper's figure.

Embeddings -> attention -> layer -> encoder -> pooler -> BertModel. Submodule names
follow Hugging Face's `modeling_bert.py` (`encoder.layer.N.attention.self.query`, ...)
so every published checkpoint loads without renaming; the structure is our own.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import BertPreTrainedModel
from .config import BertConfig
from .outputs import EncoderOutput


def activation(name: str):
    """The feed-forward non-linearity: BERT uses exact (erf) GELU; `gelu_new` is the tanh one."""
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    return nn.ReLU()


class Embeddings(nn.Module):
    """word + position + token_type (segment) embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        embeddings = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(position_ids)
        )
        return self.dropout(self.LayerNorm(embeddings))  # (batch, seq, hidden)


def attend(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, dropout_p: float, return_probs: bool
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention: the one place the attention math lives.

    query/key/value: (batch, heads, seq, head_size); key_mask: bool (batch, 1, 1, seq),
    True where a key may be attended to, or None when nothing is padded.
    Returns the context (batch, heads, seq, head_size) and, when asked, the
    probabilities (batch, heads, seq, seq). A varlen or flash kernel replaces this function.
    """
    if not return_probs:
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout_p)
        return context, None
    # Probabilities were asked for, which the fused kernel does not return: spell it out.
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.size(-1))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    context = F.dropout(probs, dropout_p) @ value
    return context, probs


def unpad(states: Tensor, token_indices: Tensor) -> Tensor:
    """(batch, seq, ...) -> (tokens, ...): the real tokens alone, in row-major order."""
    return states.flatten(0, 1).index_select(0, token_indices)


def pad(states: Tensor, token_indices: Tensor, batch: int, seq: int) -> Tensor:
    """(tokens, ...) -> (batch, seq, ...) with zeros at the padded positions: `unpad` undone."""
    padded = states.new_zeros(batch * seq, *states.shape[1:]).index_copy(0, token_indices, states)
    return padded.view(batch, seq, *states.shape[1:])


def attend_unpadded(query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor, token_indices: Tensor,
                    dropout_p: float) -> Tensor:
    """`attend` on unpadded tokens: query/key/value and the context are (tokens, heads, head_size).

    CPUs have no varlen attention kernel, so the inputs go back to the padded layout for `attend`
    and the context comes out unpadded; a varlen kernel (cu_seqlens) replaces this function.
    """
    batch, seq = key_mask.size(0), key_mask.size(-1)
    query, key, value = (pad(states, token_indices, batch, seq).transpose(1, 2) for states in (query, key, value))
    context, _ = attend(query, key, value, key_mask, dropout_p, return_probs=False)
    return unpad(context.transpose(1, 2), token_indices)


class SelfAttention(nn.Module):
    """Multi-head self-attention projections; the math itself is `attend` (or `attend_unpadded`)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, token_indices: Tensor | None,
                return_probs: bool):
        """hidden_states: (batch, seq, hidden), or (tokens, hidden) when token_indices is given."""
        query, key, value = (proj(hidden_states).unflatten(-1, (self.num_heads, -1))  # (..., heads, head_size)
                             for proj in (self.query, self.key, self.value))
        dropout_p = self.dropout_p if self.training else 0.0
        if token_indices is not None:
            context, probs = attend_unpadded(query, key, value, key_mask, token_indices, dropout_p), None
        else:
            context, probs = attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                    key_mask, dropout_p, return_probs)
            context = context.transpose(1, 2)  # (batch, seq, heads, head_size)
        return context.flatten(-2), probs  # same leading shape as hidden_states


class ResidualOutput(nn.Module):
    """dense -> dropout -> add the sub-layer's input -> LayerNorm.

    Post-LN, as in the original BERT: the norm comes after the residual sum, and
    every BERT checkpoint was trained that way.
    """

    def __init__(self, in_features: int, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(states)) + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = SelfAttention(config)  # named `self` because checkpoints say `attention.self.query`
        self.output = ResidualOutput(config.hidden_size, config)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, token_indices: Tensor | None,
                return_probs: bool):
        context, probs = self.self(hidden_states, key_mask, token_indices, return_probs)
        return self.output(context, hidden_states), probs


class Intermediate(nn.Module):
    """The feed-forward's expansion: hidden -> intermediate_size, then GELU."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = activation(config.hidden_act)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class Layer(nn.Module):
    """One encoder block: self-attention, then the position-wise feed-forward, each post-LN."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = ResidualOutput(config.intermediate_size, config)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, token_indices: Tensor | None = None,
                return_probs: bool = False):
        attended, probs = self.attention(hidden_states, key_mask, token_indices, return_probs)
        return self.output(self.intermediate(attended), attended), probs


class Encoder(nn.Module):
    """The stack of layers; in training it drops padding once on the way in and restores it once on the way out.

    Unpadded, the layers' matmuls, norms, GELUs and dropouts see (tokens, hidden) instead of
    (batch, seq, hidden), as in MosaicML's bert_layers and ModernBERT. It pays when enough of the
    batch is padding (`unpad_above`, a fraction; None turns it off). Only in training: at inference
    the padded positions keep the values transformers gives them, and attention probabilities,
    when asked for, come from the padded path.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        # BERT-mini on CPU: unpadding won ~7% of a step at 10% padding, ~28% at 28%, and broke even near 4%.
        self.unpad_above: float | None = 0.05

    def real_token_indices(self, key_mask: Tensor | None, output_attentions: bool) -> Tensor | None:
        """Flat (batch * seq) positions of the real tokens when running unpadded pays, else None."""
        if key_mask is None or output_attentions or not self.training or self.unpad_above is None:
            return None
        real = key_mask.flatten()  # (batch * seq,)
        if 1 - real.float().mean().item() <= self.unpad_above:
            return None
        return real.nonzero().squeeze(1)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, output_hidden_states: bool, output_attentions: bool):
        batch, seq, _ = hidden_states.shape
        token_indices = self.real_token_indices(key_mask, output_attentions)

        def padded(states: Tensor) -> Tensor:  # (batch, seq, hidden) whichever way the layers ran
            return states if token_indices is None else pad(states, token_indices, batch, seq)

        all_hidden_states = [hidden_states] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        if token_indices is not None:
            hidden_states = unpad(hidden_states, token_indices)  # (tokens, hidden) until the end
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, key_mask, token_indices, output_attentions)
            if output_hidden_states:
                all_hidden_states.append(padded(hidden_states))
            if output_attentions:
                all_attentions.append(probs)
        return padded(hidden_states), all_hidden_states, all_attentions


class Pooler(nn.Module):
    """dense + tanh on the [CLS] vector: the sentence summary NSP was trained on."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


def key_mask_from(attention_mask: Tensor | None) -> Tensor | None:
    """(batch, seq) 1/0 padding mask -> bool (batch, 1, 1, seq) for `attend`; None if nothing is padded.

    Built once per forward pass; layers never look at padding themselves.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None  # no mask lets SDPA pick its fastest kernel
    return attention_mask[:, None, None, :].bool()


class BertModel(BertPreTrainedModel):
    """The bare encoder: token ids -> contextual vectors (and the pooled [CLS])."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """input_ids (batch, seq) -> EncoderOutput; every optional input has BERT's default."""
        batch, seq = input_ids.shape
        if seq > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {seq} tokens is longer than max_position_embeddings "
                f"({self.config.max_position_embeddings}): truncate it (tokenizer truncation=True) or split it"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids)
        hidden_states, all_hidden, all_attentions = self.encoder(
            hidden_states, key_mask_from(attention_mask), output_hidden_states, output_attentions
        )
        return EncoderOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
        )
