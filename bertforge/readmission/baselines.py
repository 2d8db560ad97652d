"""ClinicalBERT's two readmission baselines, bag-of-words and Bi-LSTM, on the same chunks as BERT.

Both are trained on chunks (one row per 318-word chunk, labelled with its admission's label) and
scored per admission by ClinicalBERT's formula (`long_documents.document_probabilities`,
method "clinical"), so every row of Table 4 is computed the same way; the dev chunks that pick the best
epoch are scored so too, for every kind (`scored_admissions`; bag-of-words has no epochs to pick from).

- Bag-of-words (Huang et al. 2019): logistic regression on the top 5,000 words; here the counts of
  the 5,000 most frequent words of the training chunks.
- Bi-LSTM: as kexinhuang12345/clinicalBERT `bilstm.py` (Keras): word embeddings (100), a
  bidirectional LSTM, max-pool over time, dense 50 + ReLU, dropout 0.1, one sigmoid output,
  binary cross-entropy, Adam at a constant lr 1e-3, 3 epochs, at most 318 words per chunk, a
  vocabulary of at most 44,082 training words; the best epoch on the dev set is kept. It trains
  through the one training loop (`train.loop.train`: progress, metrics.jsonl, checkpoints, the
  best model by the dev admissions' AUROC, exact resume). Differences: embeddings are randomly initialised (the
  original loaded its clinical word2vec, which is not available offline), the LSTM has no
  recurrent dropout (torch's LSTM lacks it; dropout is applied to the embeddings instead),
  padding is masked out of the max-pool, the best epoch is chosen on dev AUROC (the original
  used dev loss), Adam's eps is the loop's 1e-6 (Keras: 1e-7), and a chunk keeps its first 318
  words (Keras kept the last).
"""
import contextlib
import json
import logging
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline
from torch import nn

from ..atomic import published_folder
from ..models.checkpoint import WEIGHTS_SAFETENSORS
from ..models.outputs import ClassifierOutput
from ..tasks.long_documents import CLINICALBERT_C, SINGLE_LABEL, document_probabilities
from ..tasks.metrics import binary_labels, readmission_metrics
from ..train.batches import ShuffledBatches, predict_rows
from ..train.collate import pad_rows
from ..train.config import Device, FinetuningConfig
from ..train.runner import RecipeRun
from ..validation import Bound, checked

logger = logging.getLogger("bertforge")

# Words are runs of letters and digits, lower-cased, for both baselines (Keras' Tokenizer also
# lower-cased and dropped punctuation). CountVectorizer's default would drop one-character words.
WORD_PATTERN = r"(?u)\b\w+\b"
_WORDS = re.compile(WORD_PATTERN)
MAX_VOCABULARY = 44082  # bilstm.py's max_words_count
BILSTM_CONFIG = "bilstm.json"  # beside model.safetensors: the sizes and the vocabulary
EVAL_BATCH_SIZE = 256  # chunks per Bi-LSTM forward pass when scoring (no gradients: larger than training's)


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

    Owns its vocabulary so that it can encode raw chunks (`word_ids`, then `collate_chunks` for
    forward's inputs), and saves both (`save_pretrained` / `from_pretrained`), so the training loop
    can checkpoint it and keep its best.
    """

    def __init__(self, vocabulary: Vocabulary, embedding_dim: int = 100, hidden_size: int = 128,
                 max_words: int = 318, dropout: float = 0.1):
        super().__init__()
        self.vocabulary = vocabulary
        self.sizes = {"embedding_dim": embedding_dim, "hidden_size": hidden_size, "max_words": max_words,
                      "dropout": dropout}
        self.max_words = max_words
        self.embeddings = nn.Embedding(len(vocabulary), embedding_dim, padding_idx=Vocabulary.PAD)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, batch_first=True, bidirectional=True)
        self.dense = nn.Linear(2 * hidden_size, 50)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(50, 1)

    def word_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each chunk's ids (its first max_words words; at least one id)."""
        return [self.vocabulary.encode(text, self.max_words) for text in texts]

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor | None = None
                ) -> ClassifierOutput:
        """logits (batch,) of P(readmitted) from input_ids (batch, seq) padded with 0 and lengths (batch,);
        with labels (batch,) of 0./1., also the mean binary cross-entropy as loss."""
        embedded = self.dropout(self.embeddings(input_ids))  # (batch, seq, embedding_dim)
        hidden_states = bidirectional_lstm(self.lstm, embedded, lengths)  # (batch, seq, 2 * hidden)
        padding = input_ids == Vocabulary.PAD
        pooled = hidden_states.masked_fill(padding[:, :, None], float("-inf")).max(dim=1).values  # (batch, 2 * hidden)
        logits = self.classifier(self.dropout(torch.relu(self.dense(pooled)))).squeeze(-1)
        loss = None if labels is None else nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
        return ClassifierOutput(loss=loss, logits=logits)

    def save_pretrained(self, folder: str | os.PathLike, tokenizer: None = None) -> Path:
        """Write model.safetensors and bilstm.json (sizes and vocabulary) into folder: a new folder appears whole;
        into an existing one each file is replaced whole and the folder's other files stay.

        tokenizer is there for the training loop's call and must be None: the vocabulary is the tokenizer.
        """
        if tokenizer is not None:
            raise TypeError("a BiLSTMClassifier saves its own vocabulary; pass no tokenizer")
        folder = Path(folder)
        weights = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
        card = {"architecture": type(self).__name__, **self.sizes, "vocabulary": self.vocabulary.words}
        with published_folder(folder, existing="merge") as staging:
            save_file(weights, str(staging / WEIGHTS_SAFETENSORS))
            (staging / BILSTM_CONFIG).write_text(json.dumps(card) + "\n", encoding="utf-8")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "BiLSTMClassifier":
        """The classifier `save_pretrained` wrote, in eval mode on the CPU.

        Raises ValueError naming the file when the folder holds no Bi-LSTM or a damaged one.
        """
        folder = Path(folder)
        config_path, weights_path = folder / BILSTM_CONFIG, folder / WEIGHTS_SAFETENSORS
        if not config_path.is_file() or not weights_path.is_file():
            raise ValueError(f"{folder} holds no Bi-LSTM classifier ({BILSTM_CONFIG} and {WEIGHTS_SAFETENSORS} "
                             "are needed); give the best/ or step-N/model folder of a Bi-LSTM run")
        try:
            card = json.loads(config_path.read_text(encoding="utf-8"))
            model = cls(Vocabulary(card["vocabulary"]), **{key: card[key] for key in
                                                         ("embedding_dim", "hidden_size", "max_words", "dropout")})
            model.load_state_dict(load_file(str(weights_path)))
        except (ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as error:
            raise ValueError(f"{folder} holds a damaged Bi-LSTM classifier ({type(error).__name__}: {error}); "
                             "train it again") from error
        return model.eval()


def bidirectional_lstm(lstm: nn.LSTM, inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Outputs (batch, seq, 2 * hidden) of a one-layer, batch_first, bidirectional `lstm` over inputs
    (batch, seq, features) right-padded to lengths (batch,); zeros at padding.

    Each direction reads its own sequence's words only, as when the batch is packed
    (pack_padded_sequence), and the outputs equal the packed ones up to float rounding. Packing is
    not used because torch runs a packed LSTM on the CPU one time step at a time, and the backward
    pass of each step's slice fills a zero gradient as large as the whole batch. That made the
    backward pass grow with the square of the length: 1.6-2.3 s for 32 chunks of 318 words, against
    0.13 s here. Instead each direction runs unpacked. The backward direction runs forward over
    each sequence reversed within its length, so it starts at the sequence's last word, not at its
    padding.
    """
    positions = torch.arange(inputs.shape[1], device=inputs.device)
    lengths = lengths.to(inputs.device)[:, None]
    real = positions < lengths  # (batch, seq)
    # Position t of a sequence of length n takes word n - 1 - t; padding stays put. Its own inverse.
    reversal = torch.where(real, lengths - 1 - positions, positions)[:, :, None]  # (batch, seq, 1)

    def reversed_within_lengths(states: torch.Tensor) -> torch.Tensor:  # (batch, seq, width)
        return states.gather(1, reversal.expand_as(states))

    forward = _one_direction(lstm, inputs, "")
    backward = reversed_within_lengths(_one_direction(lstm, reversed_within_lengths(inputs), "_reverse"))
    return torch.cat([forward, backward], dim=-1) * real[:, :, None]


def _one_direction(lstm: nn.LSTM, inputs: torch.Tensor, suffix: str) -> torch.Tensor:
    """Outputs (batch, seq, hidden) of one direction of `lstm` ("" forward, "_reverse" backward), run from t = 0."""
    weights = [getattr(lstm, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    zeros = inputs.new_zeros(1, inputs.shape[0], lstm.hidden_size)
    # torch.lstm is the op nn.LSTM.forward calls. Calling it directly lets one direction's weights run alone.
    return torch.lstm(inputs, hx=(zeros, zeros), params=weights, has_biases=True, num_layers=1, dropout=0.0,
                      train=lstm.training, bidirectional=False, batch_first=True)[0]


def collate_chunks(word_ids: Sequence[Sequence[int]], labels: np.ndarray | None = None) -> dict[str, torch.Tensor]:
    """A Bi-LSTM batch: input_ids (batch, longest) padded with 0, lengths (batch,), labels (batch,) as 0./1."""
    padded = pad_rows({"input_ids": word_ids}, Vocabulary.PAD)
    batch = {"input_ids": padded["input_ids"], "lengths": padded["attention_mask"].sum(dim=1)}
    if labels is not None:
        batch["labels"] = torch.as_tensor(labels, dtype=torch.float32)
    return batch


def train_bilstm(train_texts: Sequence[str], train_labels, *, dev_texts: Sequence[str] | None = None,
                 dev_labels=None, dev_admissions=None, c: float = CLINICALBERT_C, seed: int = 0, epochs: float = 3,
                 batch_size: int = 32, embedding_dim: int = 100, hidden_size: int = 128, max_words: int = 318,
                 lr: float = 1e-3, min_count: int = 2, dropout: float = 0.1, eval_batch_size: int = EVAL_BATCH_SIZE,
                 training: Mapping[str, Any] | None = None, output_dir: str | os.PathLike | None = None,
                 resume: bool = False, device: Device = "auto") -> tuple[BiLSTMClassifier, Vocabulary]:
    """(fitted model in eval mode, its vocabulary), trained on chunks by the one loop through the recipe runner.

    As the original (`bilstm_training`): binary cross-entropy, Adam at a constant lr (AdamW with no weight
    decay, the loop's eps 1e-6), no gradient clipping, shuffled batches every epoch; `training` (the loop's
    settings by FinetuningConfig field: max_steps, eval_every, best_metric, learning_rate, warmup, ...)
    replaces any of them. Embeddings are randomly initialised (no pretrained word2vec is available offline).
    The vocabulary holds training words seen at least min_count times (at most 44,082 words, as the original).

    With dev data, the dev chunks are scored after every epoch as Table 4 scores test chunks
    (`scored_admissions`: eval_auroc, eval_auprc, eval_rp80 of the admissions' scores; dev_admissions names
    each dev chunk's admission, by default its own) and the model with the best dev AUROC (or training's
    best_metric) is returned (else the last). The run (metrics.jsonl, a checkpoint per epoch, best/) goes to
    output_dir, which the caller owns (`train.run_folder.claim_run_folder`); resume=True continues it exactly.
    Without output_dir, a temporary folder is used and removed. device: auto (the GPU when there
    is one), cuda or cpu. The same seed gives the same model on the CPU; the global torch RNG is
    left as it was. Raises ValueError for bad texts or labels (see `bag_of_words`), for dev texts
    without dev labels or dev admissions not one per dev chunk, for epochs < 1, and for training
    naming output_dir, seed or device (arguments of their own).
    """
    train_texts, train_labels = _checked_chunks(train_texts, train_labels, "train")
    evaluate = dev_evaluation(dev_texts, dev_labels, dev_admissions, c, eval_batch_size)
    checked("epochs", epochs, float, bound=Bound(1))
    vocabulary = Vocabulary.build(train_texts, min_count=min_count)
    with contextlib.ExitStack() as stack:
        run_dir = Path(output_dir) if output_dir is not None else \
            Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bertforge-bilstm-")))
        run = RecipeRun(bilstm_training(run_dir, lr, seed, device, training), resume=resume)
        # The loop reseeds the global RNG every step (dropout); this run must not change the caller's.
        stack.enter_context(torch.random.fork_rng(devices=[run.device] if run.device.type == "cuda" else []))
        torch.manual_seed(seed)  # the initial weights
        model = BiLSTMClassifier(vocabulary, embedding_dim, hidden_size, max_words, dropout)
        word_ids = model.word_ids(train_texts)
        batches = ShuffledBatches(len(word_ids), batch_size, seed=seed,
                                  collate=lambda rows: collate_chunks([word_ids[i] for i in rows], train_labels[rows]))
        config = run.schedule(batches, epochs, has_dev=evaluate is not None, default_metric="auroc")
        logger.warning("bilstm: %d training chunks, %d words in the vocabulary, %d steps (%d batches an epoch)",
                       len(word_ids), len(vocabulary), config.max_steps, batches.batches_per_epoch)
        model = run.fit(model, batches, config, evaluate, statistics=accuracy)
    return model.eval(), model.vocabulary


def dev_evaluation(texts: Sequence[str] | None, labels, admissions, c: float, batch_size: int):
    """The loop's evaluate of a Bi-LSTM on dev chunks (`scored_admissions`' metrics), or None without dev texts."""
    if (texts is None) != (labels is None) or (texts is None and admissions is not None):
        raise ValueError("pass dev_texts and dev_labels (and dev_admissions) together, or none of them")
    if texts is None:
        return None
    texts, labels = _checked_chunks(texts, labels, "dev")
    # Each chunk its own admission: a one-chunk admission's score is its chunk's probability.
    admissions = np.arange(len(texts)) if admissions is None else np.asarray(admissions)
    if admissions.shape != (len(texts),):
        raise ValueError(f"{len(texts)} dev texts, dev_admissions {admissions.shape}: one admission id per chunk")

    def evaluate(network: BiLSTMClassifier) -> dict[str, float]:
        return scored_admissions(admissions, labels, chunk_probabilities(network, texts, batch_size), c)["metrics"]
    return evaluate


def bilstm_training(run_dir: Path, lr: float, seed: int, device: Device,
                    training: Mapping[str, Any] | None = None) -> FinetuningConfig:
    """The original's optimisation as the loop's settings: Adam at a constant lr (no weight decay, no warm-up,
    no clipping), in float32 (as the original; AMX's bf16 speeds matrix products, and an LSTM this small is not
    bound by them), counted in epochs, one checkpoint kept; then `training`'s settings in their place.

    Raises ValueError when training names output_dir, seed or device: the run folder, the data order and the
    initial weights follow train_bilstm's own arguments.
    """
    training = dict(training or {})
    own = sorted({"output_dir", "seed", "device"} & set(training))
    if own:
        raise ValueError(f"training sets {', '.join(own)}; pass it to train_bilstm as its own argument")
    original = FinetuningConfig(output_dir=str(run_dir), learning_rate=lr, weight_decay=0.0, warmup=0,
                                schedule="constant", max_grad_norm=math.inf, seed=seed, device=device, precision="fp32")
    return replace(original, **training)


def accuracy(batch: dict[str, torch.Tensor], output: ClassifierOutput) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The training loop's statistic: chunks classified right at P = 0.5, as (right, chunks)."""
    right = ((output.logits > 0) == (batch["labels"] > 0.5)).sum()
    return {"accuracy": (right, batch["labels"].new_tensor(len(batch["labels"])))}


def chunk_probabilities(model: Pipeline | BiLSTMClassifier, texts: Sequence[str],
                        batch_size: int = EVAL_BATCH_SIZE) -> np.ndarray:
    """P(readmitted) (n,) of each chunk, batch_size at a time, from a `bag_of_words` Pipeline or a `BiLSTMClassifier`.

    Raises TypeError for any other model and ValueError for non-str texts.
    """
    texts = _checked_texts(texts, "texts")
    if isinstance(model, Pipeline):
        positive = list(model.classes_).index(1)
        # In slices: a large split's word counts are never all in memory at once.
        return np.concatenate([model.predict_proba(texts[start:start + batch_size])[:, positive]
                               for start in range(0, len(texts), batch_size)] or [np.zeros(0)])
    if isinstance(model, BiLSTMClassifier):
        if not texts:
            return np.zeros(0)
        was_training = model.training
        word_ids = model.word_ids(texts)
        # Length-sorted batches: little padding; rows come back in the order of texts.
        logits = predict_rows(model, [len(ids) for ids in word_ids],
                              lambda rows: collate_chunks([word_ids[i] for i in rows]),
                              batch_size=batch_size, device=next(model.parameters()).device)
        model.train(was_training)
        return torch.sigmoid(torch.from_numpy(np.stack(logits)).double()).numpy()
    raise TypeError(f"cannot score chunks with a {type(model).__name__}; pass a bag_of_words Pipeline "
                    "or a BiLSTMClassifier")


def admission_scores(admission_ids: Sequence | np.ndarray, chunk_probabilities: Sequence[float] | np.ndarray,
                     c: float = CLINICALBERT_C) -> tuple[np.ndarray, np.ndarray]:
    """(admission ids (d,) sorted, scores (d,)): ClinicalBERT's (P_max + P_mean n/c) / (1 + n/c) per admission.

    chunk_probabilities (n_chunks,) are P(readmitted), one per entry of admission_ids (n_chunks,): combined as
    `finetune` and `predict` combine a two-class model's P(class 1), by the one function they call.
    Raises ValueError for mismatched lengths, no chunks, or c <= 0.
    """
    probabilities = np.asarray(chunk_probabilities, dtype=np.float64)
    if probabilities.ndim != 1:
        raise ValueError(f"chunk_probabilities must be 1-D P(readmitted), got shape {probabilities.shape}")
    return document_probabilities(admission_ids, probabilities, SINGLE_LABEL, method="clinical", c=c)


def scored_admissions(admission_ids: Sequence | np.ndarray, chunk_labels: Sequence[int] | np.ndarray,
                      probabilities: Sequence[float] | np.ndarray, c: float = CLINICALBERT_C) -> dict:
    """Chunks scored as Table 4 scores them: {"metrics": `readmission_metrics` of the admission scores (auroc,
    auprc, rp80, auprc_trapezoid), "admissions": ids (d,) sorted, "labels": theirs (d,), "scores": (d,)}.

    The one validation that picks a best model, for every kind (BERT's epochs and the Bi-LSTM's), and the
    test set's scoring. Raises ValueError as `admission_scores` does, and unless both labels are present.
    """
    admissions, scores = admission_scores(admission_ids, probabilities, c=c)
    _, labels = admission_labels(admission_ids, chunk_labels)
    return {"metrics": readmission_metrics(labels, scores), "admissions": admissions, "labels": labels,
            "scores": scores}


def admission_labels(admission_ids: Sequence | np.ndarray, chunk_labels) -> tuple[np.ndarray, np.ndarray]:
    """(admission ids (d,) sorted, their labels (d,)): every chunk carries its admission's label."""
    admissions, first = np.unique(np.asarray(admission_ids), return_index=True)
    return admissions, np.asarray(chunk_labels)[first]


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
