"""The BERT encoder, top to bottom as in the paper's figure.

Embeddings -> attention -> layer -> encoder -> pooler -> BertModel. Submodule names
follow Hugging Face's `modeling_bert.py` (`encoder.layer.N.attention.self.query`, ...)
so every published checkpoint loads without renaming; the structure is our own. The
attention math is `engine.attention.attention`; with a `Packing` the padding is dropped
once before the embeddings and restored once after the last layer (MosaicBERT, ModernBERT).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..engine.attention import attention
from ..engine.prepacked_linear import PrepackedLinear
from ..engine import precision
from ..engine.precision import Int8Linear
from ..engine.unpadding import Packing, pad, unpad
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
        return self.dropout(self.LayerNorm(embeddings))  # (batch, seq, hidden), or (tokens, hidden) packed


class SelfAttention(nn.Module):
    """Multi-head self-attention: query, key and value projections, then `attention`.

    Three Linear modules under Hugging Face's names, so named_parameters(), state_dict(), files,
    gradients and optimizer groups all say `attention.self.query` as every BERT checkpoint does.
    (One fused (hidden, 3 * hidden) matmul measured no faster on the CPU in float32, within a few per
    cent of the projection alone, and needed hooks that renamed it on every save and load.) int8
    inference is where fusing pays: quantising the input is a third of an int8 projection's time, so
    `engine.precision.quantize_linear_layers` gives the module one Int8Linear for the three
    (`fused_projection`), used for self-attention; cross-attention's keys and values read another
    input than its queries and keep the three.
    """

    shared_input_linears = ("query", "key", "value")  # read the same input: one fused product for int8

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.fused_projection: nn.Module | None = None  # query, key and value in one (int8 only)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, packing: Packing | None, return_probs: bool,
                memory: Tensor | None = None):
        """hidden_states: (batch, seq, hidden), or (tokens, hidden) with packing; the context has the same shape.

        memory: (batch, memory_seq, hidden) states the keys and values come from instead (cross-attention,
        a decoder's; transformers' encoder_hidden_states), padded layout only.
        """
        heads = (self.num_heads, -1)  # (..., hidden) -> (..., heads, head_size)
        if memory is None and self.fused_projection is not None:
            projected = self.fused_projection(hidden_states).chunk(3, dim=-1)  # views of (..., 3 * hidden)
        else:
            source = hidden_states if memory is None else memory
            projected = (self.query(hidden_states), self.key(source), self.value(source))
        query, key, value = (states.unflatten(-1, heads) for states in projected)
        dropout_p = self.dropout_p if self.training else 0.0
        context, probs = attention(query, key, value, key_mask=key_mask, packing=packing, dropout_p=dropout_p,
                                   return_probs=return_probs)  # (..., heads, head_size)
        return context.flatten(-2), probs


def set_attention_dropout(model: nn.Module, probability: float) -> None:
    """Train every SelfAttention of `model` with this dropout on its attention probabilities. The config keeps the
    checkpoint's attention_probs_dropout_prob, so a model saved after is the checkpoint it was."""
    for module in model.modules():
        if isinstance(module, SelfAttention):
            module.dropout_p = probability


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
        if isinstance(self.dense, PrepackedLinear):  # CPU inference: the sum made in the product's epilogue
            return self.LayerNorm(self.dense.plus(states, residual))
        return self.LayerNorm(self.dropout(self.dense(states)) + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = SelfAttention(config)  # named `self` because checkpoints say `attention.self.query`
        self.output = ResidualOutput(config.hidden_size, config)

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, packing: Packing | None, return_probs: bool,
                memory: Tensor | None = None):
        context, probs = self.self(hidden_states, key_mask, packing, return_probs, memory)
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

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, packing: Packing | None = None,
                return_probs: bool = False):
        attended, probs = self.attention(hidden_states, key_mask, packing, return_probs)
        return self.feed_forward(attended), probs

    def feed_forward(self, attended: Tensor) -> Tensor:
        """The position-wise half of the block (a decoder runs its cross-attention between the two halves)."""
        rows = attended.reshape(-1, attended.size(-1))  # (tokens, hidden)
        piece_rows = precision.INT8_FEED_FORWARD_ROWS if isinstance(self.intermediate.dense, Int8Linear) else 0
        if piece_rows and len(rows) > piece_rows:
            # int8: a piece's (rows, intermediate) states stay in the L2 caches from the product through the
            # rescale, GELU and the next quantisation. Outlier channels are then found piece by piece.
            pieces = [self.output(self.intermediate(piece), piece) for piece in rows.split(piece_rows)]
            return torch.cat(pieces).view_as(attended)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    """The stack of layers, on (batch, seq, hidden) or, packed, on (tokens, hidden) throughout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states: Tensor, key_mask: Tensor | None, packing: Packing | None,
                output_hidden_states: bool, output_attentions: bool):
        """Returns the last states, every layer's states (with the input first) and every layer's probabilities."""
        all_hidden_states = [hidden_states] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        for layer in self.layer:
            hidden_states, probs = layer(hidden_states, key_mask, packing, output_attentions)
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            if output_attentions:
                all_attentions.append(probs)
        return hidden_states, all_hidden_states, all_attentions


class Pooler(nn.Module):
    """dense + tanh on the [CLS] vector: the sentence summary NSP was trained on."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden_states[:, 0]))


def key_mask_from(attention_mask: Tensor | None) -> Tensor | None:
    """(batch, seq) 1/0 padding mask -> bool (batch, 1, 1, seq) for `attention`; None if nothing is padded.

    Built once per forward pass; layers never look at padding themselves. Without padding, no mask
    lets SDPA pick its fastest kernel, but finding out reads the mask: a device sync on CUDA and a
    graph break under torch.compile, so only eager CPU code looks.
    """
    if attention_mask is None:
        return None
    if attention_mask.device.type == "cpu" and not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return None
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
        packing: Packing | None = None,
    ) -> EncoderOutput:
        """input_ids (batch, seq) -> EncoderOutput; every optional input has BERT's default.

        packing (made on the host from attention_mask, see `engine.unpadding`): drop the padding
        before the embeddings and run every layer on the real tokens alone, (tokens, hidden); the
        outputs are padded back once, with zeros at padded positions (transformers leaves values
        there that mean nothing). Asking for attention probabilities runs the padded path.
        """
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
        if output_attentions:
            packing = None  # probabilities are (seq, seq) per sequence: the padded layout
        if packing is None:
            key_mask = key_mask_from(attention_mask)
        else:
            key_mask = packing.key_mask
            input_ids, token_type_ids, position_ids = (unpad(ids, packing) for ids in
                                                       (input_ids, token_type_ids, position_ids))  # (tokens,)
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids)
        hidden_states, all_hidden, all_attentions = self.encoder(
            hidden_states, key_mask, packing, output_hidden_states, output_attentions
        )
        if packing is not None:  # (tokens, hidden) -> (batch, seq, hidden), once
            hidden_states = pad(hidden_states, packing)
            all_hidden = [pad(states, packing) for states in all_hidden] if all_hidden is not None else None
        return EncoderOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
        )
