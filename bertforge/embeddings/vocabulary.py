"""A vocabulary named on the command line (`--vocab`, a recipe's `tokenizer.vocab`): a model folder, read as every
command reads one, or vocabulary files alone."""
from __future__ import annotations

import os
from pathlib import Path

from ..models.folder import is_model_folder, read_model_folder
from ..resources import resolve_model
from ..tokenization.folder import load_tokenizer
from ..tokenization.tokenizer import BertTokenizer


def load_vocabulary(spec: str | os.PathLike, lowercase: bool | None = None) -> BertTokenizer:
    """The tokenizer `spec` names (a packaged short name too): a checkpoint folder's as `embed` loads it
    (`load_tokenizer`: a sentence-transformers module's subfolder, its lower-casing), else a folder of vocabulary
    files, a vocab.txt or a tokenizer.json as they are. `lowercase` True / False overrides what the vocabulary
    says (tokenize --lowercase). Raises ValueError as BertTokenizer.from_pretrained does."""
    path = Path(resolve_model(spec))
    if is_model_folder(path):
        folder = read_model_folder(path)
        if lowercase is None:
            return load_tokenizer(folder)
        path = folder.transformer  # a sentence-transformers folder keeps its vocabulary in 0_Transformer/
    return BertTokenizer.from_pretrained(path, do_lower_case=lowercase)  # None: as the vocabulary says
