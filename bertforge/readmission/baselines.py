"""ClinicalBERT's two readmission baselines, bag-of-words and Bi-LSTM, on the same chunks as BERT.

Both are trained on chunks (one row per 318-word chunk, labelled with its admission's label) and
scored per admission by ClinicalBERT's formula (`long_documents.combine_per_document`,
method "clinical"), so every row of Table 4 is computed the same way.

- Bag-of-words (Huang et al. 2019): logistic regression on the top 5,000 words; here the counts of
  the 5,000 most frequent words of the training chunks.
- Bi-LSTM: as kexinhuang12345/clinicalBERT `bilstm.py` (Keras): word embeddings (100), a
  bidirectional LSTM, max-pool over time, dense 50 + ReLU, dropout 0.1, one sigmoid output,
  binary cross-entropy, Adam, 3 epochs, at most 318 words per chunk, a vocabulary of at most
  44,082 training words; the best epoch on the dev set is kept. Differences: embeddings are
  randomly initialised (the original loaded its clinical word2vec, which is not available
  offline), the LSTM has no recurrent dropout (torch's LSTM lacks it; dropout is applied to the
  embeddings instead), padding is masked out of the max-pool, the best epoch is chosen on dev
  AUROC (the original used dev loss), and a chunk keeps its first 318 words (Keras kept the last).
"""
import copy
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import Pipeline
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..tasks.long_documents import combine_per_document
from ..tasks.metrics import binary_labels

# Words are runs of letters and digits, lower-cased, for both baselines (Keras' Tokenizer also
# lower-cased and dropped punctuation). CountVectorizer's default would drop one-character words.
WORD_PATTERN = r"(?u)\b\w+\b"
_WORDS = re.compile(WORD_PATTERN)
MAX_VOCABULARY = 44082  # bilstm.py's max_words_count


def bag_of_words(train_texts: Sequence[str], train_labels, seed: int = 0, max_features: int = 5000,
                 C: float = 1.0) -> Pipeline:
    """A fitted Pipeline ("counts" → "model"): counts of the max_features most frequent words → logistic regression.

    Counts, not binary presence: the paper says only "bag-of-words" and CountVectorizer counts by
    default; C is sklearn's inverse L2 strength (1.0, sklearn's default; the paper gives none).
    Raises ValueError for non-str or no texts, a label count that differs, or labels not 0/1 with both present.
    """
    train_texts, train_labels = _checked_chunks(train_texts, train_labels, "train")
    pipeline = Pipeline([
        ("counts", CountVectorizer(max_features=max_features, token_pattern=WORD_PATTERN, lowercase=True)),
        ("model", LogisticRegression(C=C, max_iter=2000, random_state=seed)),
    ])
    return pipeline.fit(train_texts, train_labels)


@dataclass
class Vocabulary:
    """Word ↔ id for the Bi-LSTM: id 0 pads, id 1 is any word not kept; then words by falling count."""
    words: list[str]
    index: dict[str, int] = field(init=False, repr=False)

    PAD = 0
    UNKNOWN = 1

    def __post_init__(self):
        self.index = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def build(cls, texts: Sequence[str], min_count: int = 2, max_size: int = MAX_VOCABULARY) -> "Vocabulary":
        """Words seen at least min_count times in texts, the max_size - 2 most frequent (ties by spelling)."""
        counts = Counter(word for text in texts for word in split_words(text))
        kept = sorted((word for word, n in counts.items() if n >= min_count), key=lambda word: (-counts[word], word))
        return cls(["[PAD]", "[UNK]"] + kept[:max_size - 2])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, max_words: int) -> list[int]:
        """Ids of the first max_words words; an empty text is one [UNK] so every chunk has a length."""
        ids = [self.index.get(word, self.UNKNOWN) for word in split_words(text)[:max_words]]
        return ids or [self.UNKNOWN]


def split_words(text: str) -> list[str]:
    """Lower-cased words, as both baselines see them."""
    return _WORDS.findall(text.lower())


class BiLSTMClassifier(nn.Module):
    """Embeddings → bidirectional LSTM → max over time → dense 50 + ReLU → dropout → one logit.

    Owns its vocabulary so that it can encode raw chunks (`encode`). forward takes input_ids
    (batch, seq) padded with 0 and lengths (batch,), and returns logits (batch,) of P(readmitted).
    """

    def __init__(self, vocabulary: Vocabulary, embedding_dim: int = 100, hidden_size: int = 128,
                 max_words: int = 318, dropout: float = 0.1):
        super().__init__()
        self.vocabulary = vocabulary
        self.max_words = max_words
        self.embeddings = nn.Embedding(len(vocabulary), embedding_dim, padding_idx=Vocabulary.PAD)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, batch_first=True, bidirectional=True)
        self.dense = nn.Linear(2 * hidden_size, 50)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(50, 1)

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids (n, longest) padded with 0, lengths (n,)) of raw chunk texts."""
        ids = [self.vocabulary.encode(text, self.max_words) for text in texts]
        lengths = torch.tensor([len(row) for row in ids])
        input_ids = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for row, row_ids in enumerate(ids):
            input_ids[row, :len(row_ids)] = torch.tensor(row_ids)
        return input_ids, lengths

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        embedded = self.dropout(self.embeddings(input_ids))  # (batch, seq, embedding_dim)
        # Packed, so the backward direction starts at each chunk's last word, not at its padding.
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        hidden_states, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True,
                                               total_length=input_ids.shape[1])  # (batch, seq, 2 * hidden)
        padding = input_ids == Vocabulary.PAD
        pooled = hidden_states.masked_fill(padding[:, :, None], float("-inf")).max(dim=1).values  # (batch, 2 * hidden)
        return self.classifier(self.dropout(torch.relu(self.dense(pooled)))).squeeze(-1)


def train_bilstm(train_texts: Sequence[str], train_labels, *, dev_texts: Sequence[str] | None = None,
                 dev_labels=None, seed: int = 0, epochs: int = 3, batch_size: int = 32, embedding_dim: int = 100,
                 hidden_size: int = 128, max_words: int = 318, lr: float = 1e-3,
                 min_count: int = 2) -> tuple[BiLSTMClassifier, Vocabulary]:
    """(fitted model in eval mode, its vocabulary) trained on chunks with Adam and binary cross-entropy.

    Embeddings are randomly initialised (no pretrained word2vec is available offline). The
    vocabulary holds training words seen at least min_count times (at most 44,082 words, as the
    original). Prints the mean training loss per epoch and, with dev data, the chunk-level dev
    AUROC; the epoch with the best dev AUROC is kept (else the last). The same seed gives the
    same model on CPU; the global torch RNG is left as it was. Raises ValueError for bad texts or
    labels (see `bag_of_words`), for dev texts without dev labels, and for epochs < 1.
    """
    train_texts, train_labels = _checked_chunks(train_texts, train_labels, "train")
    if (dev_texts is None) != (dev_labels is None):
        raise ValueError("pass dev_texts and dev_labels together, or neither")
    if dev_texts is not None:
        dev_texts, dev_labels = _checked_chunks(dev_texts, dev_labels, "dev")
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")

    vocabulary = Vocabulary.build(train_texts, min_count=min_count)
    with torch.random.fork_rng(devices=[]):  # dropout and initialisation draw from the global RNG
        torch.manual_seed(seed)
        model = BiLSTMClassifier(vocabulary, embedding_dim, hidden_size, max_words)
        input_ids, lengths = model.encode(train_texts)
        targets = torch.tensor(train_labels, dtype=torch.float32)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        loss_function = nn.BCEWithLogitsLoss()
        order_generator = torch.Generator().manual_seed(seed)
        best_auroc, best_state = -np.inf, None
        for epoch in range(1, epochs + 1):
            model.train()
            total_loss = 0.0
            for batch in torch.randperm(len(train_texts), generator=order_generator).split(batch_size):
                batch_lengths = lengths[batch]
                logits = model(input_ids[batch, :int(batch_lengths.max())], batch_lengths)
                loss = loss_function(logits, targets[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total_loss += loss.item() * len(batch)
            message = f"bilstm epoch {epoch}/{epochs}: train loss {total_loss / len(train_texts):.4f}"
            if dev_texts is not None:
                dev_auroc = roc_auc_score(dev_labels, chunk_probabilities(model, dev_texts))
                message += f", dev AUROC {dev_auroc:.4f}"
                if dev_auroc > best_auroc:
                    best_auroc, best_state = dev_auroc, copy.deepcopy(model.state_dict())
            print(message, flush=True)
    if best_state is not None:
        model.load_state_dict(best_state)
        print(f"bilstm: kept the epoch with dev AUROC {best_auroc:.4f}", flush=True)
    return model.eval(), vocabulary


def chunk_probabilities(model: Pipeline | BiLSTMClassifier, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """P(readmitted) (n,) of each chunk, from a `bag_of_words` Pipeline or a `BiLSTMClassifier`.

    Raises TypeError for any other model and ValueError for non-str texts.
    """
    texts = _checked_texts(texts, "texts")
    if isinstance(model, Pipeline):
        positive = list(model.classes_).index(1)
        return model.predict_proba(texts)[:, positive]
    if isinstance(model, BiLSTMClassifier):
        was_training = model.training
        model.eval()
        probabilities = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                input_ids, lengths = model.encode(texts[start:start + batch_size])
                probabilities.append(torch.sigmoid(model(input_ids, lengths)).double().numpy())
        model.train(was_training)
        return np.concatenate(probabilities) if probabilities else np.zeros(0)
    raise TypeError(f"cannot score chunks with a {type(model).__name__}; pass a bag_of_words Pipeline "
                    "or a BiLSTMClassifier")


def admission_scores(admission_ids: Sequence | np.ndarray, chunk_probabilities: Sequence[float] | np.ndarray,
                     c: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """(admission ids (d,) sorted, scores (d,)): ClinicalBERT's (P_max + P_mean n/c) / (1 + n/c) per admission.

    chunk_probabilities (n_chunks,) are P(readmitted), one per entry of admission_ids (n_chunks,).
    Raises ValueError for mismatched lengths, no chunks, or c <= 0.
    """
    probabilities = np.asarray(chunk_probabilities, dtype=np.float64)
    if probabilities.ndim != 1:
        raise ValueError(f"chunk_probabilities must be 1-D P(readmitted), got shape {probabilities.shape}")
    return combine_per_document(admission_ids, probabilities, method="clinical", c=c)


def _checked_texts(texts: Sequence[str], name: str) -> list[str]:
    texts = list(texts)
    bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
    if bad is not None:
        raise ValueError(f"{name}[{bad}] is a {type(texts[bad]).__name__}, not a str; pass chunk texts")
    return texts


def _checked_chunks(texts: Sequence[str], labels, split: str) -> tuple[list[str], np.ndarray]:
    texts = _checked_texts(texts, f"{split}_texts")
    labels = np.asarray(labels)
    if not texts:
        raise ValueError(f"no {split} texts")
    if labels.shape != (len(texts),):
        raise ValueError(f"{len(texts)} {split} texts but labels of shape {labels.shape}; pass one 0/1 label per chunk")
    return texts, binary_labels(labels, what=f"{split} labels")[0]
