"""Fine-tuning tasks: how files become rows of token ids, and model outputs become metrics and predictions.

Each task class has the same small surface, which `tasks/finetune.py` and `predict` use:
    model_class                 the BertFor... class it trains
    default_metric              the dev metric that picks the best model
    config_overrides()          num_labels / id2label / label2id / problem_type for the model
    training_rows()             rows with len() and collate(indices) -> padded batch with labels
    evaluate(model, split, batch_size, device) -> metrics on data.<split>
    predict_file(model, input, output, batch_size, device) -> rows written
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from ..settings import PATH
from .long_documents import CLINICALBERT_C, Combine

if TYPE_CHECKING:  # only Rows' annotation: the command line's parser imports this package and needs no torch
    import torch

TaskName = Literal["classification", "ner", "qa"]
TASKS = get_args(TaskName)
# data.max_length 0 takes the task's standard length (BERT's GLUE / CoNLL and SQuAD scripts').
STANDARD_MAX_LENGTH = {"classification": 128, "ner": 128, "qa": 384}


@dataclass
class TaskSettings:
    """Where the data is and how it is read; a field a task does not use is ignored by it."""

    train: str = field(default="", metadata=PATH)  # paths: see settings.resolve_paths
    dev: str = field(default="", metadata=PATH)
    test: str = field(default="", metadata=PATH)
    # classification: CSV/TSV/JSONL columns
    text_columns: list[str] = field(default_factory=lambda: ["text"])  # two names: a text pair
    label_column: str = "label"
    problem_type: str = ""  # "": single- or multi-label from the labels; or regression
    label_separator: str = "|"  # between the labels of a multi-label CSV cell
    # sequence lengths and windows; 0 / -1 take the task's standard value
    max_length: int = 0  # STANDARD_MAX_LENGTH: classification and ner 128, qa 384
    stride: int = -1  # classification: the overlap of a long text's windows, as transformers' tokenizers' (-1: 32)
    doc_stride: int = 128  # qa: the step between a context's windows' starts, run_squad.py's (the BERT paper's 128)
    max_windows: int = 0  # 0: every window of a long text
    combine: Combine = "mean"  # windows -> document (clinical: ClinicalBERT's mix, with combine_c)
    combine_c: float = CLINICALBERT_C
    # question answering
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    version_2: bool = False  # SQuAD 2.0: questions may have no answer

    def __post_init__(self) -> None:
        from ..validation import check_fields

        check_fields(self, "data.")


@dataclass
class Rows:
    """Training rows as the loop's batcher wants them: how many, and a padded batch for some indices."""

    size: int
    collate: Callable[[list[int]], dict[str, torch.Tensor]]

    def __len__(self) -> int:
        return self.size


def load_task(name: str, settings: TaskSettings, tokenizer, config=None):
    """The task `name` reading `settings`; with a fine-tuned model's config, its labels come from there."""
    if name == "classification":
        from .classification.task import ClassificationTask
        return ClassificationTask(settings, tokenizer, config)
    if name == "ner":
        from .ner.task import NerTask
        return NerTask(settings, tokenizer, config)
    if name == "qa":
        from .qa.task import QuestionAnsweringTask
        return QuestionAnsweringTask(settings, tokenizer, config)
    raise ValueError(f"unknown task {name!r}; use one of {', '.join(TASKS)}")
