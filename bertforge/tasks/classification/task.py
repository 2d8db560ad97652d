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


class ClassificationTask:
    model_class = BertForSequenceClassification

    def __init__(self, settings: TaskSettings, tokenizer, config=None):
        self.settings, self.tokenizer = settings, tokenizer
        self.max_length = settings.max_length or STANDARD_MAX_LENGTH["classification"]
        # Default overlap: 32 pieces, or a quarter of a window when windows are short.
        self.stride = min(32, (self.max_length - 2) // 4) if settings.stride < 0 else settings.stride
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

    def document_scores(self, model, windows: Windows, batch_size: int, device) -> np.ndarray:
        """(documents, classes) probabilities, or (documents,) values for regression: the windows' probabilities
        combined per document by `long_documents.document_probabilities` (a two-class task combines P(class 1))."""
        logits = np.stack(predict_rows(model, [len(ids) for ids in windows.input_ids], windows.collate,
                                       batch_size=batch_size, device=device))
        probabilities = shown_scores(logits, self.labels.output).astype(np.float64)  # as transformers' pipeline
        if self.labels.problem_type == "regression":
            probabilities = probabilities[:, 0]
        documents, scores = document_probabilities(windows.document_index, probabilities, self.labels.problem_type,
                                                   self.settings.combine, self.settings.combine_c)
        if len(documents) != windows.num_documents:
            raise RuntimeError(f"{windows.num_documents} documents but scores for {len(documents)}")
        return scores

    def predict_file(self, model, input_path: str, output_path: str, batch_size: int = 64,
                     device=torch.device("cpu")) -> int:
        """One output row per input row: its texts, the prediction and (classes) each class's probability."""
        rows = read_rows(input_path, text_columns=self.settings.text_columns)
        windows = encode_windows(self.tokenizer, rows.texts, self.max_length, self.stride,
                                 self.settings.max_windows or None)
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
        return encode_windows(self.tokenizer, rows.texts, self.max_length, self.stride,
                              self.settings.max_windows or None, labels=labels)
