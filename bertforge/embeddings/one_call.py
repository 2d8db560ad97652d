"""One call, one answer: `embed`, `word_vector` and `token_vectors` build an `Embedder` (embed.py) for a
checkpoint folder or a model object and ask it once. To embed many lists with one model, build the Embedder."""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np
import torch

from .embed import Embedder
from .options import LayerSpec


def embedder_for(model_or_path, tokenizer=None, **options) -> Embedder:
    """An Embedder from a checkpoint folder, or from a model object and its tokenizer."""
    if isinstance(model_or_path, (str, os.PathLike)):
        return Embedder.from_pretrained(model_or_path, tokenizer, **options)
    return Embedder(model_or_path, tokenizer, **options)


def embed(model_or_path, texts: Iterable[str], layers: LayerSpec = -1, pooling: str | None = None,
          normalize: bool | None = None, batch_size: int = 32, max_length: int | None = None, tokenizer=None,
          layer_combine: str | None = None, progress: bool | None = None,
          device: str | torch.device | None = None, dtype: torch.dtype | str | None = None,
          max_batch_tokens: int | None = None) -> np.ndarray:
    """Sentence vectors for texts: float32 (len(texts), dim), in the order of texts.

    model_or_path: a checkpoint folder (model and tokenizer are loaded from it), or a
    BertModel / head model together with `tokenizer`. The other arguments are `Embedder`'s;
    pooling and normalize left out follow a folder (its sentence-transformers Pooling and
    Normalize, else mean and no normalisation).
    To embed many lists with one model, build an `Embedder` once and call `.encode`.
    Raises ValueError for invalid input or options.
    """
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, pooling=pooling,
                            normalize=normalize, batch_size=batch_size, max_length=max_length,
                            progress=progress, device=device, dtype=dtype, max_batch_tokens=max_batch_tokens)
    return embedder.encode(texts)


def word_vector(model_or_path, tokenizer, sentence: str, word: str, occurrence: int = 0,
                layers: LayerSpec | None = None, layer_combine: str | None = None, **options) -> np.ndarray:
    """The in-context vector of `word` in `sentence`: float32 (dim,). See `Embedder.word_vector`.

    layers=None takes `options.DEFAULT_WORD_LAYERS` (the mean of the last four), as `bertforge senses` and
    the explorer do.
    """
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, **options)
    return embedder.word_vector(sentence, word, occurrence)


def token_vectors(model_or_path, tokenizer, sentence: str, layers: LayerSpec = -1,
                  layer_combine: str | None = None, **options) -> tuple[list[str], np.ndarray]:
    """(tokens, float32 (num_tokens, dim)) for one sentence. See `Embedder.token_vectors`."""
    embedder = embedder_for(model_or_path, tokenizer, layers=layers, layer_combine=layer_combine, **options)
    return embedder.token_vectors(sentence)
