"""Fine-tuning recipe: a labelled file + any BERT checkpoint -> the best model on dev, its test metrics.

The task (classification, ner, qa) turns files into rows of token ids and model outputs
into metrics and predictions (bertforge/tasks); everything else is the one training loop
(`train.loop.train`) with BERT's fine-tuning defaults: batch 32, lr 2e-5, 3 epochs, 10%
warm-up, weight decay 0.01, evaluation on dev every epoch, the best dev model kept.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..tokenization.folder import load_tokenizer
from ..train.config import FinetuningConfig
from ..train.runner import RecipeRun, run_recipe
from . import STANDARD_MAX_LENGTH, TASKS, TaskName, TaskSettings, load_task
from ..errors import UsageError
from ..validation import check_fields
from ..models.config import BertConfig
from ..settings import CHECKPOINT, KEYS_OF, build, recipe_from_values

logger = logging.getLogger("bertforge")
TASK_FILE = "task.json"  # beside every saved model of a run: the task and how its inputs are read, for `predict`


@dataclass
class FinetuneRecipe:
    task: TaskName = "classification"
    init_from: str = field(default="minilm", metadata=CHECKPOINT)  # any BERT checkpoint folder (or packaged short name)
    data: TaskSettings = field(default_factory=TaskSettings)
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 64
    model_overrides: dict = field(default_factory=dict, metadata={KEYS_OF: BertConfig})  # e.g. hidden_dropout_prob
    training: FinetuningConfig = field(default_factory=FinetuningConfig)  # max_steps/eval_every 0: from epochs

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise UsageError(f"unknown task {self.task!r}; use one of {', '.join(TASKS)}")
        check_fields(self, "recipe.")

    @classmethod
    def from_values(cls, values: dict, base: Path = Path(".")) -> "FinetuneRecipe":
        """A recipe from a (YAML-shaped) mapping; its relative paths are relative to `base`."""
        return recipe_from_values(cls, values, base)


def run_finetuning(recipe: FinetuneRecipe, resume: bool = False, overwrite: bool = False) -> dict:
    """Train on data.train, keep the best model on data.dev, score it on data.test.

    Returns {"dev": metrics, "test": metrics, ...} and writes it to output_dir/results.json;
    the best model (HF format, with tokenizer and task.json) is in output_dir/best. The output
    folder follows `train.run_folder`: a new run, resume=True, or overwrite=True.
    """
    if not recipe.data.train:
        raise ValueError("no training file: set data.train (CSV, TSV, JSONL, CoNLL or SQuAD JSON)")
    check_length_fits(recipe)
    return run_recipe(recipe.training, lambda run: finetune_in(recipe, run), init_from=recipe.init_from,
                      resume=resume, overwrite=overwrite, command="bertforge finetune", recipe=recipe)


def check_length_fits(recipe: FinetuneRecipe) -> None:
    """data.max_length (0: the task's standard length) against init_from's position table, before the run folder is
    claimed: past the table the forward pass failed mid-run. Raises UsageError naming the table's size."""
    from ..models.folder import read_model_folder
    from ..resources import resolve_model

    folder = read_model_folder(resolve_model(recipe.init_from)).transformer
    length = recipe.data.max_length or STANDARD_MAX_LENGTH[recipe.task]
    where = "data." if recipe.data.max_length else f"data. (0: the {recipe.task} standard {length}) "
    BertConfig.from_json_file(folder / "config.json").checked_max_length(length, where=where)


def finetune_in(recipe: FinetuneRecipe, run: RecipeRun) -> dict:
    task = load_task(recipe.task, recipe.data, run.tokenizer)
    model = run.build(task.model_class, **task.config_overrides(), **recipe.model_overrides)
    model.files_beside_weights = task_card(recipe.task, run.init_from, recipe.data)
    rows = task.training_rows()
    batches = run.batches(len(rows), recipe.batch_size, rows.collate)
    config = run.schedule(batches, recipe.epochs, has_dev=bool(recipe.data.dev), default_metric=task.default_metric)
    logger.warning("fine-tuning %s from %s on %s: %d training rows, %d steps (%g epochs of %d batches)",
                   task.model_class.__name__, run.init_from, run.device, len(rows), config.max_steps, recipe.epochs,
                   batches.batches_per_epoch)
    evaluate = (lambda m: task.evaluate(m, "dev", recipe.eval_batch_size, run.device)) if recipe.data.dev else None
    final = run.fit(model, batches, config, evaluate)
    results = {"task": recipe.task, "init_from": run.init_from, "train_rows": len(rows), "steps": config.max_steps}
    for split in ("dev", "test"):
        if getattr(recipe.data, split):
            results[split] = task.evaluate(final, split, recipe.eval_batch_size, run.device)
    return results


def task_card(task: str, init_from: str | None, data: TaskSettings) -> dict[str, str]:
    """{TASK_FILE: its text}, for a model's `files_beside_weights`: what `predict`, `search --rerank` and `serve`
    need besides the HF files (`prediction_task`), the task and how its inputs were read and windowed."""
    card = {"task": task, "init_from": init_from, "data": asdict(data)}
    return {TASK_FILE: json.dumps(card, indent=2) + "\n"}


ARCHITECTURE_TASKS = {"BertForSequenceClassification": "classification", "BertForTokenClassification": "ner",
                      "BertForQuestionAnswering": "qa"}


def load_for_prediction(folder: str | Path, pair: bool = False):
    """(task, model) for a fine-tuned folder (or packaged short name): `prediction_task`, and its weights."""
    task, read = prediction_task(folder, pair)
    return task, task.model_class.from_pretrained(read.transformer)


def prediction_task(folder, pair: bool = False, tokenizer=None):
    """(task, ModelFolder) that reads inputs as the fine-tuned folder (or packaged short name) was trained to read
    them, for `predict`, `search --rerank` and `serve --classifier/--reranker` alike: bertforge's task.json says how
    (the run's data settings: columns, max_length, windows); a checkpoint fine-tuned elsewhere has none, and its task
    follows config.json's architecture, a classifier read at its folder's max_seq_length (the length a transformers
    pipeline reads; the standard 128 cut such a model's 512-token inputs into windows) and, with `pair`, as a text
    pair (a cross-encoder such as sentence-transformers' CrossEncoder saves). `folder` may be one read already (a
    ModelFolder), and `tokenizer` its tokenizer loaded already (the server's head models hold both).

    Raises ValueError for a model that is not fine-tuned for one of the tasks, or whose task.json
    and architecture disagree."""
    from ..models.config import BertConfig
    from ..models.folder import ModelFolder, read_model_folder
    from ..resources import resolve_model
    from . import TaskSettings

    read = folder if isinstance(folder, ModelFolder) else read_model_folder(resolve_model(folder))
    folder, architecture = read.transformer, read.architecture
    config = BertConfig.from_json_file(folder / "config.json")
    if architecture not in ARCHITECTURE_TASKS:
        raise ValueError(f"{folder} holds a {architecture}, not a fine-tuned model: give one of "
                         f"{', '.join(ARCHITECTURE_TASKS)} (fine-tune it with `bertforge finetune`)")
    name, card_path = ARCHITECTURE_TASKS[architecture], folder / TASK_FILE
    if card_path.exists():
        card = json.loads(card_path.read_text(encoding="utf-8"))
        settings = build(TaskSettings, readable_card_data(card), "task.json data")
        if card["task"] != name:
            raise ValueError(f"{card_path} says task {card['task']!r} but config.json holds a {architecture} "
                             f"({name}); the folder mixes two models: fine-tune it again")
    elif name == "classification":
        settings = TaskSettings(max_length=read.max_seq_length,
                                text_columns=["text", "text_pair"] if pair else ["text"])
    else:
        settings = fitted_to_positions(name, config.max_position_embeddings)
    tokenizer = tokenizer or load_tokenizer(read)  # as the run that trained it read its folder
    return load_task(name, settings, tokenizer, config), read


def fitted_to_positions(name: str, positions: int):
    """The standard settings of a task (NER, QA) for a checkpoint fine-tuned elsewhere, its lengths within the
    checkpoint's position table: the standard 128 / 384 refused every input of a model of 64 positions (a tiny or
    distilled one), and `predict` has no option to shorten them. A QA window keeps SQuAD's proportions."""
    from . import STANDARD_MAX_LENGTH, TaskSettings

    standard = TaskSettings()
    length = min(STANDARD_MAX_LENGTH[name], positions)
    if name != "qa" or length == STANDARD_MAX_LENGTH[name]:
        return TaskSettings(max_length=length)
    share = length / STANDARD_MAX_LENGTH[name]  # 384 tokens: questions of 64, windows 128 apart
    return TaskSettings(max_length=length, max_query_length=max(1, int(standard.max_query_length * share)),
                        doc_stride=max(1, int(standard.doc_stride * share)))


def readable_card_data(card: dict) -> dict:
    """A task.json's data settings as TaskSettings reads them now: a question-answering card written before
    data.doc_stride (2026-11-27) kept its step between windows as data.stride."""
    data = dict(card["data"])
    if card["task"] == "qa" and "doc_stride" not in data:
        stride = data.pop("stride", -1)
        data["doc_stride"] = 128 if stride < 0 else stride
    return data
