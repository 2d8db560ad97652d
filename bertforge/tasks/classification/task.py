"""Sequence classification: single texts or pairs; multi-class, multi-label or regression; long texts in windows.

A text longer than max_length is cut into overlapping windows; every window is trained on
its document's label (as ClinicalBERT trains on note chunks), and at evaluation the window
probabilities are combined per document (mean, max or ClinicalBERT's formula) before scoring.
"""
from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np
import torch

from ...train.batches import predict_rows
from .labels import LabelSpace, shown_scores
from .reader import read_rows
from .windows import Windows, encode_windows
from ...models.heads import BertForSequenceClassification
from ..long_documents import document_probabilities
from ..metrics import problem_metrics
from .. import STANDARD_MAX_LENGTH, TaskSettings
from ..records import write_records

DEFAULT_METRICS = {"single_label_classification": "macro_f1", "multi_label_classification": "micro_f1",
                   "regression": "pearson"}


def default_stride(max_length: int) -> int:
    """The overlap of a long text's windows when data.stride does not say: 32 pieces, or a quarter of a window
    when windows are short."""
    return min(32, (max_length - 2) // 4)


class ClassificationTask:
    model_class = BertForSequenceClassification

    def __init__(self, settings: TaskSettings, tokenizer, config=None):
        self.settings, self.tokenizer = settings, tokenizer
        self.max_length = settings.max_length or STANDARD_MAX_LENGTH["classification"]
        self.stride = default_stride(self.max_length) if settings.stride < 0 else settings.stride
        self._rows = lru_cache(maxsize=None)(self._read)  # each split is read and tokenized once
        self._windows = lru_cache(maxsize=None)(self._encode)
        if config is not None:  # a fine-tuned model: its labels, whatever the files hold
            self.labels = LabelSpace.from_config(config)
        else:
            rows = self._rows("train")
            self.labels = LabelSpace.infer(rows.labels, settings.problem_type or None, settings.label_separator)
        self.labels.label_separator = settings.label_separator
        self.default_metric = DEFAULT_METRICS[self.labels.problem_type]

    def config_overrides(self) -> dict:
        return {"num_labels": self.labels.num_labels, "id2label": self.labels.id2label,
                "label2id": self.labels.label2id, "problem_type": self.labels.problem_type}

    def training_rows(self) -> Windows:
        return self._windows("train")

    def evaluate(self, model, split: str, batch_size: int = 64, device=torch.device("cpu")) -> dict[str, float]:
        """Document-level metrics on data.<split> (windows combined per document first)."""
        windows = self._windows(split)
        scores = self.document_scores(model, windows, batch_size, device)
        return problem_metrics(self.labels.problem_type, windows.labels.numpy(), scores)

    def windows(self, texts: list[tuple[str, ...]], max_length: int | None = None,
                labels: torch.Tensor | None = None) -> Windows:
        """Rows of 1 or 2 texts as this task reads them: a long text in overlapping windows (data.stride,
        data.max_windows), a pair cut to fit. max_length: the window's length, the task's unless a caller reads
        fewer tokens (a server's --max-input-length); the default overlap is then its rule at that length."""
        length, stride = max_length or self.max_length, self.stride
        if length != self.max_length:  # within the shorter windows' bounds (encode_windows checks the task's own)
            stride = min(stride if self.settings.stride >= 0 else default_stride(length), max(0, length - 3))
        return encode_windows(self.tokenizer, texts, length, stride, self.settings.max_windows or None, labels=labels)

    def document_scores(self, model, windows: Windows, batch_size: int, device) -> np.ndarray:
        """(documents, classes) probabilities, or (documents,) values for regression: `combined_scores` of the
        model's logits on the windows."""
        logits = np.stack(predict_rows(model, [len(ids) for ids in windows.input_ids], windows.collate,
                                       batch_size=batch_size, device=device))
        return self.combined_scores(logits, windows.document_index, windows.num_documents)

    def combined_scores(self, logits: np.ndarray, document_index: list[int], num_documents: int) -> np.ndarray:
        """Windows' (windows, labels) logits -> each document's scores: shown as transformers' pipeline shows
        them (`shown_scores`), then combined per document by `long_documents.document_probabilities` (a two-class
        task combines P(class 1)). `predict`, `search --rerank` and the server's classifier all score this way."""
        probabilities = shown_scores(logits, self.labels.output).astype(np.float64)
        if self.labels.problem_type == "regression":
            probabilities = probabilities[:, 0]
        documents, scores = document_probabilities(document_index, probabilities, self.labels.problem_type,
                                                   self.settings.combine, self.settings.combine_c)
        if len(documents) != num_documents:
            raise RuntimeError(f"{num_documents} documents but scores for {len(documents)}")
        return scores

    def predict_file(self, model, input_path: str, output_path: str, batch_size: int = 64,
                     device=torch.device("cpu")) -> int:
        """One output row per input row: its texts, the prediction and (classes) each class's probability."""
        rows = read_rows(input_path, text_columns=self.settings.text_columns)
        windows = self.windows(rows.texts)
        scores = self.document_scores(model, windows, batch_size, device)
        records = []
        for line, texts, score in zip(rows.row_numbers, rows.texts, scores):
            record = {"line": line, **dict(zip(self.settings.text_columns, texts))}
            record.update(self._prediction(score))
            records.append(record)
        write_records(records, output_path)
        for warning in rows.skipped:
            print(f"warning: {warning}", file=sys.stderr)
        return len(records)

    def _prediction(self, score) -> dict:
        kind = self.labels.problem_type
        if kind == "regression":
            return {"prediction": float(score)}
        probabilities = {f"p_{name}": round(float(p), 6) for name, p in zip(self.labels.labels, score)}
        if kind == "multi_label_classification":
            chosen = [name for name, p in zip(self.labels.labels, score) if p >= 0.5]
            return {"prediction": self.settings.label_separator.join(chosen), **probabilities}
        return {"prediction": self.labels.labels[int(np.argmax(score))], **probabilities}

    def _read(self, split: str):
        path = getattr(self.settings, split)
        if not path:
            raise ValueError(f"no data.{split} file given")
        return read_rows(path, text_columns=self.settings.text_columns, label_column=self.settings.label_column)

    def _encode(self, split: str) -> Windows:
        rows = self._rows(split)
        labels = self.labels.encode(rows.labels, rows.row_numbers)
        return self.windows(rows.texts, labels=labels)
