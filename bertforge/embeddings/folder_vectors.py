"""How a model folder's sentence vectors are made, as one set of options: its pooling, normalisation, length and
default prompt (`folder_options`, which `Embedder.from_pretrained` and training's scoring both read), and the prompt
put before each text (`with_prompt`: `encode`, token and word vectors, and every training batch)."""
from __future__ import annotations

from typing import Protocol

from ..models.folder import ModelFolder


class VectorSettings(Protocol):
    """What shapes a folder's sentence vectors: a ModelFolder's fields, which a BiEncoder carries too."""

    pooling: str
    normalize: bool
    max_seq_length: int

    @property
    def default_prompt(self) -> str: ...


def folder_options(folder: ModelFolder | VectorSettings) -> dict:
    """The Embedder options that give a folder's sentence-transformers vectors (its defaults for a plain one); the
    same from a BiEncoder read from the folder (tasks/retrieval), so training's scores see the vectors embed gives."""
    return {"pooling": folder.pooling, "normalize": folder.normalize, "max_length": folder.max_seq_length,
            "prompt": folder.default_prompt}


def with_prompt(prompt: str, text: str) -> str:
    """`text` as a sentence encoder reads it, in `encode` and in every training batch: the default prompt first."""
    return prompt + text
