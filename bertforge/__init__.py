"""bertforge: BERT end to end — tokenizer, model, Hugging Face checkpoints, embeddings."""
from .models.config import BertConfig
from .embeddings.embed import Embedder, embed, token_vectors, word_vector
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
