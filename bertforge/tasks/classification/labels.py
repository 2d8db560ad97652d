"""The label space of a classification problem: which labels exist, what kind of problem it is (Hugging
Face's `problem_type` names), and labels to tensors; from training labels or a fine-tuned model's config."""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .reader import _MAX_LISTED, PROBLEM_TYPES

logger = logging.getLogger("bertforge")


def output_function(problem_type: str | None, num_labels: int) -> str:
    """What a classifier's logits are shown as ("none", "sigmoid" or "softmax"), by the problem_type its config
    names (None when it names none): transformers' text-classification pipeline's rule, which sentence-transformers'
    CrossEncoder follows for one label. A model that says regression shows its values; a multi-label one, or one
    with a single output and no problem_type (a cross-encoder saved by transformers or sentence-transformers),
    sigmoids; the others a softmax. "One output is regression" is transformers' rule for the training loss only."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def shown_scores(logits: np.ndarray, function: str) -> np.ndarray:
    """(n, num_labels) logits as `output_function` names: unchanged, sigmoids, or softmax rows (float32)."""
    logits = np.asarray(logits, dtype=np.float32)
    if function == "none":
        return logits
    if function == "sigmoid":
        return 1 / (1 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@dataclass
class LabelSpace:
    """The labels of a task and how they are scored, with Hugging Face config names.

    labels: the class names, in id order (infer sorts them: numerically when all are integers,
    else as strings); empty for regression, which has one output. label_separator splits a
    CSV cell into its labels for multi-label problems. output: what predictions show of the
    logits (`output_function`; by default the problem_type's own).
    """
    problem_type: str
    labels: list[str]
    label_separator: str = "|"
    output: str = ""

    def __post_init__(self):
        if self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"unknown problem_type {self.problem_type!r}; use one of {PROBLEM_TYPES}")
        self.output = self.output or output_function(self.problem_type, self.num_labels)

    @property
    def num_labels(self) -> int:
        return 1 if self.problem_type == "regression" else len(self.labels)

    @property
    def id2label(self) -> dict[int, str]:
        # Regression keeps one named output so that BertConfig.num_labels (len of id2label) is 1.
        if self.problem_type == "regression":
            return {0: "LABEL_0"}
        return dict(enumerate(self.labels))

    @property
    def label2id(self) -> dict[str, int]:
        return {label: index for index, label in self.id2label.items()}

    @classmethod
    def infer(cls, raw_labels: Sequence, problem_type: str | None = None, label_separator: str = "|") -> LabelSpace:
        """The label space of training labels (raw values as `read_rows` returns them).

        problem_type None means multi-label when any raw label is a list or a cell joins labels with
        label_separator ("sunny|rainy"), else single-label; regression is never guessed. Raises ValueError for an
        unknown problem_type, a regression value that is not a finite number, no labels, or a single-label column
        with one class.
        """
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"unknown problem_type {problem_type!r}; use one of {PROBLEM_TYPES}")
        raw_labels = list(raw_labels)
        if not raw_labels:
            raise ValueError("no labels to infer a label space from; check the label column")
        if problem_type is None:
            problem_type = guessed_problem_type(raw_labels, label_separator)
        space = cls(problem_type, [], label_separator)
        if problem_type == "regression":
            for value in raw_labels:
                _as_float(value)
            return space
        if problem_type == "multi_label_classification":
            names = {name for value in raw_labels for name in space._label_set(value)}
        else:
            names = {_as_name(value) for value in raw_labels}
        if not names:
            raise ValueError("every row has an empty label set; a multi-label task needs at least one label")
        if problem_type == "single_label_classification" and len(names) == 1:
            raise ValueError(f"label column has one class {next(iter(names))!r}: a classifier needs at least two; "
                             "check the column or the filter")
        space.labels = _sorted_labels(names)
        return space

    @classmethod
    def from_config(cls, config) -> LabelSpace:
        """The label space a fine-tuned model was trained with, from its BertConfig (id2label, problem_type).

        problem_type None is read as transformers does: regression when there is one label (its loss),
        else single-label; predictions show a one-label model without problem_type as sigmoids, as transformers'
        pipeline and sentence-transformers' CrossEncoder do (`output_function`). A sequence classifier whose config
        names no labels has transformers' default two, LABEL_0 and LABEL_1 (transformers 5 writes id2label only when
        it differs from them). Raises ValueError when the config has no id2label and is not a sequence classifier's,
        its ids are not 0..n-1, or it is a regression of several values.
        """
        id2label = config.id2label
        if not id2label and any(name.endswith("ForSequenceClassification") for name in config.architectures or ()):
            id2label = {0: "LABEL_0", 1: "LABEL_1"}
        if not id2label:
            raise ValueError("the model config has no id2label: it was not fine-tuned for classification; "
                             "fine-tune it first, or give the labels")
        if sorted(id2label) != list(range(len(id2label))):
            raise ValueError(f"config id2label has ids {sorted(id2label)}; they must be 0..{len(id2label) - 1}")
        problem_type = config.problem_type or ("regression" if len(id2label) == 1 else "single_label_classification")
        if problem_type == "regression" and len(id2label) > 1:  # its first value alone was written, without a word
            raise ValueError(f"the model is a regression of {len(id2label)} values ({', '.join(id2label.values())}); "
                             "bertforge reads regression models of one value: run it with transformers, or "
                             "fine-tune one model per value")
        labels = [] if problem_type == "regression" else [id2label[index] for index in range(len(id2label))]
        return cls(problem_type, labels, output=output_function(config.problem_type, len(id2label)))

    def encode(self, raw_labels: Sequence, row_numbers: Sequence[int] | None = None) -> torch.Tensor:
        """Raw labels → a tensor: (n,) int64 class ids, (n, num_labels) float multi-hot, or (n,) float values.

        Raises ValueError listing labels outside the space (with their row numbers, when given)
        and the known labels, or naming a regression value that is not a number.
        """
        raw_labels = list(raw_labels)
        row_numbers = list(row_numbers) if row_numbers is not None else list(range(1, len(raw_labels) + 1))
        if self.problem_type == "regression":
            return torch.tensor([_as_float(value, row) for value, row in zip(raw_labels, row_numbers)],
                                dtype=torch.float32)
        label2id, unknown = self.label2id, {}
        if self.problem_type == "multi_label_classification":
            encoded = torch.zeros(len(raw_labels), self.num_labels)
            for index, (value, row) in enumerate(zip(raw_labels, row_numbers)):
                for name in self._label_set(value):
                    if name in label2id:
                        encoded[index, label2id[name]] = 1.0
                    else:
                        unknown.setdefault(name, []).append(row)
        else:
            ids = []
            for value, row in zip(raw_labels, row_numbers):
                name = _as_name(value)
                if name not in label2id:
                    unknown.setdefault(name, []).append(row)
                ids.append(label2id.get(name, -1))
            encoded = torch.tensor(ids, dtype=torch.long)
        if unknown:
            listed = "; ".join(f"{name!r} (rows {', '.join(map(str, rows[:5]))}{', ...' if len(rows) > 5 else ''})"
                               for name, rows in list(unknown.items())[:_MAX_LISTED])
            raise ValueError(f"{len(unknown)} label(s) the model was not trained on: {listed}; "
                             f"known labels: {self.labels}")
        return encoded

    def _label_set(self, value) -> list[str]:
        """The labels of one multi-label value: a JSON list, or a cell split on label_separator."""
        if isinstance(value, list):
            return [_as_name(item) for item in value]
        return [name.strip() for name in str(value).split(self.label_separator) if name.strip()]


def _as_name(value) -> str:
    """A label value as its class name: CSV strings stripped, JSON scalars as their text."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"label {value!r} is a {type(value).__name__}; a single-label task needs one value per "
                         "row (for several labels per row use problem_type='multi_label_classification')")
    return value.strip() if isinstance(value, str) else str(value)


def guessed_problem_type(raw_labels: list, separator: str) -> str:
    """Multi-label for JSON lists or cells joining labels with `separator` (said in a warning: a CSV's "a|b" was
    trained as a class of its own, the README's promise broken), else single-label."""
    if any(isinstance(value, list) for value in raw_labels):
        return "multi_label_classification"
    joined = sum(isinstance(value, str) and separator in value for value in raw_labels)
    if not joined:
        warn_if_numeric_target(raw_labels)
        return "single_label_classification"
    logger.warning("labels: %d cells join labels with %r, so the task is multi-label; if %r is part of a label's "
                   "name, set data.problem_type=single_label_classification", joined, separator, separator)
    return "multi_label_classification"


def warn_if_numeric_target(raw_labels: list) -> None:
    """Say so when single-label classes look like a numeric target (fractions, as STS-B's 0-5 scores): regression is
    never guessed, and 154 classes of '0.3387', '0.3393', ... were trained without a word (transformers' run_glue.py
    regresses on a float column)."""
    values = set(map(str, raw_labels))
    try:
        numbers = [float(value) for value in values]
    except ValueError:
        return
    if any(not number.is_integer() for number in numbers if math.isfinite(number)):
        logger.warning("labels: %d distinct numbers such as %r, each trained as a class of its own; for a numeric "
                       "target set data.problem_type=regression", len(values), sorted(values)[0])


def _as_float(value, row: int | None = None) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        where = f" (row {row})" if row is not None else ""
        raise ValueError(f"regression label {value!r}{where} is not a finite number; fix the value or drop the row")
    return number


def _sorted_labels(names: set[str]) -> list[str]:
    # "2" before "10": integer labels sort by value so that ids follow the numbers users expect
    # (the name breaks ties such as "01" and "1", so the order never depends on set order).
    try:
        return sorted(names, key=lambda name: (int(name), name))
    except ValueError:
        return sorted(names)
