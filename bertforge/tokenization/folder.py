"""The tokenizer of a model folder, built in one place: embeddings, serving, training, the tasks and adapt load it here.

`models.folder.read_model_folder` says where the tokenizer files are (`transformer`: the folder itself, or a
sentence-transformers module's subfolder such as 0_Transformer) and whether sentence-transformers lower-cases
texts before its tokenizer (`do_lower_case`, from sentence_bert_config.json). The folder is taken by those two
fields: models/ and tokenization/ sit on one row of docs/ARCHITECTURE.md and do not import each other.
"""
from __future__ import annotations

from .tokenizer import BertTokenizer


def load_tokenizer(folder) -> BertTokenizer:
    """The tokenizer in `folder.transformer` (a `ModelFolder`), splitting text as sentence-transformers does.

    Raises ValueError when the folder holds no vocabulary (BertTokenizer.from_pretrained).
    """
    tokenizer = BertTokenizer.from_pretrained(folder.transformer)
    if not folder.do_lower_case or tokenizer.do_lower_case:
        return tokenizer
    # ST lower-cases the text itself (str.lower) and hands it to the cased tokenizer, which keeps accents
    # unless it strips them anyway; a lower-casing BERT tokenizer would strip them by default.
    return BertTokenizer.from_pretrained(folder.transformer, do_lower_case=True,
                                         strip_accents=bool(tokenizer.strip_accents))
