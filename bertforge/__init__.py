"""bertforge: BERT end to end — tokenizer, model, Hugging Face checkpoints, embeddings.

The public names load on first use (PEP 562's module `__getattr__`), not at `import bertforge`:
every `bertforge.x` module, the command line's parser among them, imports this package first, and
these classes bring torch (about 2 s) with them. `from bertforge import BertModel` is unchanged.
"""
__all__ = [
    "BertTokenizer",
    "embed",
    "Embedder",
    "word_vector",
    "token_vectors",
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """The public name `name`, after importing the whole public API once; AttributeError for any other."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .embeddings.embed import Embedder
    from .embeddings.one_call import embed, token_vectors, word_vector
    from .models.config import BertConfig
    from .models.heads import (
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from .models.model import BertModel
    from .tokenization.tokenizer import BertTokenizer

    public = locals()
    globals().update({key: public[key] for key in __all__})  # later look-ups skip this function
    return public[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
