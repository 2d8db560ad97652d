"""Grow a model's vocabulary: new word-embedding rows at the end of the table, old ids untouched.

Appending (never inserting) keeps every id the old tokenizer produces pointing at its old row, so
the checkpoint stays valid for the old vocabulary and every token of the new one gets a row. The
MLM head grows with the table: its decoder is the embedding matrix itself (tied), its bias gets a
value per new token. transformers' `resize_token_embeddings` does the same, drawing the new rows
at random (or from the mean of all rows); here the caller chooses them (adapt: the mean of the old
pieces each new token was split into).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .checkpoint import BertPreTrainedModel


def add_token_embeddings(model: BertPreTrainedModel, rows: Tensor, bias: Tensor | None = None) -> None:
    """Append `rows` (new tokens, hidden) to the word embeddings, in place; config.vocab_size follows.

    With an MLM head, its tied decoder follows the table and its bias grows by `bias` (new tokens,),
    zeros when None. Raises ValueError for rows of another width.
    """
    bert = getattr(model, "bert", model)  # a head owns its BertModel as `bert`; a BertModel is its own
    old = bert.embeddings.word_embeddings
    if rows.dim() != 2 or rows.size(1) != old.embedding_dim:
        raise ValueError(f"new embedding rows must be (tokens, {old.embedding_dim}), got {tuple(rows.shape)}")
    size = old.num_embeddings + rows.size(0)
    grown = nn.Embedding(size, old.embedding_dim, padding_idx=old.padding_idx).to(old.weight)
    with torch.no_grad():
        grown.weight.copy_(torch.cat([old.weight, rows.to(old.weight)]))
    bert.embeddings.word_embeddings = grown
    model.config.vocab_size = bert.config.vocab_size = size
    head = getattr(getattr(model, "cls", None), "predictions", None)
    if head is None:
        return
    untied = head.decoder.weight is not old.weight  # a decoder of its own grows by the new rows too
    decoder = nn.Linear(old.embedding_dim, size, bias=False).to(old.weight)
    if untied:
        with torch.no_grad():
            decoder.weight.copy_(torch.cat([head.decoder.weight, rows.to(old.weight)]))
    else:
        decoder.weight = grown.weight  # tied again, to the grown table
    head.decoder = decoder
    extra = torch.zeros(rows.size(0)) if bias is None else bias
    head.bias = nn.Parameter(torch.cat([head.bias.detach(), extra.to(head.bias)]))
