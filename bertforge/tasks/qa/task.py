"""Extractive question answering on SQuAD v1.1 / v2.0 JSON: windows of the context, n-best spans, EM and F1."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from ...atomic import write_text
from ...train.batches import predict_rows
from .answers import postprocess
from .features import QAFeatures, qa_features
from .scoring import squad_evaluate
from .squad import QAExample, read_squad
from ...models.heads import BertForQuestionAnswering
from .. import STANDARD_MAX_LENGTH, Rows, TaskSettings
from ...errors import UsageError


class QuestionAnsweringTask:
    model_class = BertForQuestionAnswering
    default_metric = "f1"

    def __init__(self, settings: TaskSettings, tokenizer, config=None):
        self.settings, self.tokenizer = settings, tokenizer
        self.max_length = settings.max_length or STANDARD_MAX_LENGTH["qa"]
        if settings.stride >= 0:  # one name, one meaning: a `stride` means an overlap wherever it is read
            raise UsageError(f"data.stride={settings.stride} is the overlap of a classification text's windows; "
                             "question answering steps its windows by data.doc_stride (run_squad.py's step between "
                             "window starts, 128 by default): set that instead")
        self.doc_stride = settings.doc_stride
        self._examples = lru_cache(maxsize=None)(self._read)
        self._features = lru_cache(maxsize=None)(self._encode)

    def config_overrides(self) -> dict:
        return {}  # start and end logits: the head's two outputs are fixed

    def training_rows(self) -> Rows:
        features = self._features("train")
        return Rows(len(features), features.pad_batch)

    def evaluate(self, model, split: str, batch_size: int = 64, device=torch.device("cpu")) -> dict[str, float]:
        """Exact match and F1 (official normalisation, best over the gold answers) on data.<split>."""
        examples = self._examples(split)
        return squad_evaluate(examples, self.answers(model, examples, self._features(split), batch_size, device))

    def answers(self, model, examples: list[QAExample], features: QAFeatures, batch_size: int, device,
                return_nbest: bool = False):
        logits = predict_rows(model, [len(ids) for ids in features.input_ids], features.pad_batch,
                              batch_size=batch_size, per_token=True, device=device,
                              outputs=lambda output: (output.start_logits, output.end_logits))
        return postprocess(examples, features, [start for start, _ in logits], [end for _, end in logits],
                           n_best_size=self.settings.n_best_size, max_answer_length=self.settings.max_answer_length,
                           version_2=self.settings.version_2, return_nbest=return_nbest)

    def predict_file(self, model, input_path: str, output_path: str, batch_size: int = 64,
                     device=torch.device("cpu")) -> int:
        """Answer every question of a SQuAD-format file; writes {id: answer} JSON (the official
        prediction format) and, beside it, the n-best spans with probabilities. Raises UsageError for an output
        name other than .json (a .jsonl one held one JSON object, not JSON Lines)."""
        if Path(output_path).suffix != ".json":
            raise UsageError(f"cannot write question-answering predictions to {output_path}: they are SQuAD's "
                             "{id: answer} JSON object; use a .json file name")
        examples = read_squad(input_path, training=False)
        features = qa_features(self.tokenizer, examples, self.max_length, self.doc_stride,
                               self.settings.max_query_length, training=False)
        predictions, nbest = self.answers(model, examples, features, batch_size, device, return_nbest=True)
        output = Path(output_path)
        write_text(output.with_suffix(".nbest.json"), json.dumps(nbest, indent=2, ensure_ascii=False) + "\n")
        write_text(output, json.dumps(predictions, indent=2, ensure_ascii=False) + "\n")
        return len(predictions)

    def _read(self, split: str):
        path = getattr(self.settings, split)
        if not path:
            raise ValueError(f"no data.{split} file given")
        return read_squad(path, training=split == "train")

    def _encode(self, split: str) -> QAFeatures:
        return qa_features(self.tokenizer, self._examples(split), self.max_length, self.doc_stride,
                           self.settings.max_query_length, training=split == "train")
