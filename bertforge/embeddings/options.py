"""Checking what a user passes to the embedding API, once, where it enters.

Each function returns the value in the form the rest of the code trusts, or raises a
ValueError that names the problem and the fix.
"""
from __future__ import annotations

from typing import Iterable, Literal, Sequence, get_args

import numpy as np

from ..errors import UsageError
from ..models.model import BertModel
from . import LayerCombine

LAYER_COMBINES = get_args(LayerCombine)
# Readable names for the layer choices people make by hand (Devlin et al. 2018, table 7).
LAYER_ALIASES: dict[str, tuple[tuple[int, ...], str | None]] = {
    "last": ((-1,), None),
    "second_to_last": ((-2,), None),
    "last_four_mean": ((-4, -3, -2, -1), "mean"),
    "last_four_concat": ((-4, -3, -2, -1), "concat"),
}

# The layers of a word's in-context vector that the explorer offers, its default first: the mean of the last four,
# the best feature-based choice of Devlin et al. 2018 (table 7) and what seed 003's word-sense picture takes.
WordLayers = Literal["last_four_mean", "last", "second_to_last"]
WORD_LAYER_CHOICES = get_args(WordLayers)
# What `word_vector`, `bertforge senses` and the explorer take when no layers are chosen (layers=None).
DEFAULT_WORD_LAYERS = WORD_LAYER_CHOICES[0]

LayerSpec = int | str | Sequence[int]


def fits(alias: str, num_layers: int) -> bool:
    """Whether a model of num_layers layers has every hidden state the alias names."""
    return all(-(num_layers + 1) <= index <= num_layers for index in LAYER_ALIASES[alias][0])


def default_word_layers(num_layers: int) -> str:
    """DEFAULT_WORD_LAYERS, or on a model too shallow for it (under three layers) the next choice it has."""
    return next(choice for choice in WORD_LAYER_CHOICES if fits(choice, num_layers))


def resolve_encoder(model) -> BertModel:
    """The BertModel inside what the user passed: the model itself or a head's `.bert`."""
    if isinstance(model, BertModel):
        return model
    if isinstance(getattr(model, "bert", None), BertModel):
        return model.bert
    raise ValueError(
        f"expected a bertforge BertModel, a head model with a `.bert` encoder, or a checkpoint folder; "
        f"got {type(model).__module__}.{type(model).__qualname__}. Load weights with bertforge.BertModel.from_pretrained(folder)"
    )


def resolve_layers(layers: LayerSpec | None, layer_combine: str | None, num_layers: int) -> tuple[tuple[int, ...], str]:
    """Layer choice -> (absolute hidden-state indices in 0..num_layers, combine mode); None is
    `default_word_layers`, a word vector's default.

    Raises UsageError (a ValueError; on the command line exit 2, an option's mistake) for an unknown alias or
    combine mode, an empty list, a non-int index, or an index outside the model's layers.
    """
    if layer_combine is not None and layer_combine not in LAYER_COMBINES:
        raise UsageError(f"layer_combine={layer_combine!r} is not one of {LAYER_COMBINES}")
    if layers is None:
        layers = default_word_layers(num_layers)
    if isinstance(layers, str):
        if layers not in LAYER_ALIASES:
            raise UsageError(
                f"layers={layers!r} is not a known alias; use one of {tuple(LAYER_ALIASES)}, "
                "an int (-1 last, 0 embeddings) or a list of ints"
            )
        indices, alias_combine = LAYER_ALIASES[layers]
        if alias_combine and layer_combine not in (None, alias_combine):
            raise UsageError(f"layers={layers!r} already means layer_combine={alias_combine!r}; drop layer_combine")
        layer_combine = alias_combine
    else:
        indices = (layers,) if isinstance(layers, int) else tuple(layers)
    if not indices:
        raise UsageError("layers is empty; pass at least one layer index, e.g. layers=-1")
    return tuple(absolute_layer(i, num_layers) for i in indices), layer_combine or "mean"


def absolute_layer(index, num_layers: int) -> int:
    # bool is an int subclass, and layers=True is surely a mistake.
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise UsageError(f"layer index {index!r} is not an int; use e.g. -1 (last) or 0 (embeddings)")
    if not -(num_layers + 1) <= index <= num_layers:
        raise UsageError(
            f"layer {index} is out of range: the model has {num_layers} layers, so hidden states are "
            f"0 (embeddings) to {num_layers}, or -{num_layers + 1} to -1 counting from the end"
        )
    return int(index) % (num_layers + 1)


def check_texts(texts: Iterable[str]) -> list[str]:
    """A list of str, or ValueError naming the first item that is not one."""
    if isinstance(texts, str):
        raise ValueError("texts is a single str; pass a list of texts, e.g. [text]")
    texts = list(texts)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            hint = " (a missing value read from a table is a float NaN: drop or fill it)" if isinstance(text, float) else ""
            raise ValueError(f"texts[{index}] is {type(text).__name__}, not str{hint}")
    return texts


def check_sentence(sentence) -> str:
    if not isinstance(sentence, str):
        raise ValueError(f"sentence must be a str, got {type(sentence).__name__}")
    return sentence


def check_max_length(max_length: int | None, tokenizer, model: BertModel) -> int:
    """The truncation length: the user's, or (None or 0) the tokenizer's limit, never past the position table."""
    positions = model.config.max_position_embeddings
    if not max_length:  # None, or 0 as every command's --max-length reads it (validation.BOUNDS): the default
        return min(int(getattr(tokenizer, "model_max_length", positions)), positions)
    return model.config.checked_max_length(max_length)
