"""bertforge: BERT end to end — tokenizer, model, Hugging Face checkpoints, embeddings."""
from .config import BertConfig
from .embed import embed
from .heads import (
    BertForMaskedLM,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel
from .tokenizer import BertTokenizer

__all__ = [
    "BertTokenizer",
    "embed",
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
