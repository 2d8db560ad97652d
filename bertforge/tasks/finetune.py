"""Fine-tuning recipe: a labelled file + any BERT checkpoint -> the best model on dev, its test metrics.

The task (classification, ner, qa) turns files into rows of token ids and model outputs
into metrics and predictions (bertforge/tasks); everything else is the one training loop
(`train.loop.train`) with BERT's fine-tuning defaults: batch 32, lr 2e-5, 3 epochs, 10%
warm-up, weight decay 0.01, evaluation on dev every epoch, the best dev model kept.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..train.batches import ShuffledBatches
from ..tokenization.tokenizer import BertTokenizer
from ..train.best import best_model_folder
from ..train.distributed import select_device
from ..train.loop import TrainConfig, train
from . import TASKS, TaskSettings, load_task
from ..settings import build, read_recipe, resolve

logger = logging.getLogger("bertforge")
RESULTS_FILE = "results.json"
TASK_FILE = "task.json"  # beside the best model: the task and how its inputs are read, for `predict`


def finetuning_defaults() -> TrainConfig:
    return TrainConfig(output_dir="runs/finetune", max_steps=0, learning_rate=2e-5, warmup=0.1, weight_decay=0.01, log_every=10,
                       eval_at_start=False, keep_last=1)


@dataclass
class FinetuneRecipe:
    task: str = "classification"  # classification | ner | qa
    init_from: str = "minilm"  # any BERT checkpoint folder (or packaged short name)
    data: TaskSettings = field(default_factory=TaskSettings)
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 64
    model_overrides: dict = field(default_factory=dict)  # BertConfig fields, e.g. hidden_dropout_prob
    training: TrainConfig = field(default_factory=finetuning_defaults)  # max_steps/eval_every 0: from epochs

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; use one of {', '.join(TASKS)}")

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] = ()) -> "FinetuneRecipe":
        return cls.from_values(read_recipe(path, overrides), base=Path(path).resolve().parent)

    @classmethod
    def from_values(cls, values: dict, base: Path = Path(".")) -> "FinetuneRecipe":
        """A recipe from a (YAML-shaped) mapping; data paths are relative to `base`."""
        values = dict(values)
        values["training"] = {**asdict(finetuning_defaults()), **values.get("training", {})}
        recipe = build(cls, values, "recipe")
        for name in ("train", "dev", "test"):
            if getattr(recipe.data, name):
                setattr(recipe.data, name, resolve(base, getattr(recipe.data, name)))
        return recipe


def run_finetuning(recipe: FinetuneRecipe, resume: bool = False) -> dict:
    """Train on data.train, keep the best model on data.dev, score it on data.test.

    Returns {"dev": metrics, "test": metrics, ...} and writes it to output_dir/results.json;
    the best model (HF format, with tokenizer and task.json) is in output_dir/best.
    """
    from ..resources import resolve_model

    if not recipe.data.train:
        raise ValueError("no training file: set data.train (CSV, TSV, JSONL, CoNLL or SQuAD JSON)")
    init_from = str(resolve_model(recipe.init_from))
    device = select_device(recipe.training.device)
    tokenizer = BertTokenizer.from_pretrained(init_from)
    task = load_task(recipe.task, recipe.data, tokenizer)
    torch.manual_seed(recipe.training.seed)  # the fresh head's weights
    model = task.model_class.from_pretrained(init_from, **task.config_overrides(), **recipe.model_overrides)

    rows = task.training_rows()
    batches = ShuffledBatches(len(rows), recipe.batch_size, rows.collate, seed=recipe.training.seed)
    config = schedule(recipe.training, recipe.epochs, batches.batches_per_epoch, has_dev=bool(recipe.data.dev),
                      default_metric=task.default_metric)
    run_dir = Path(config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    logger.warning("fine-tuning %s from %s on %s: %d training rows, %d steps (%g epochs of %d batches)",
                   task.model_class.__name__, init_from, device, len(rows), config.max_steps, recipe.epochs,
                   batches.batches_per_epoch)
    evaluate = (lambda m: task.evaluate(m, "dev", recipe.eval_batch_size, device)) if recipe.data.dev else None
    train(model, batches, config, evaluate=evaluate, tokenizer=tokenizer, device=device, resume=resume)

    best = best_model_folder(run_dir)
    if not (best / "config.json").exists():  # no dev split: the last model is the one that ships
        model.save_pretrained(best, tokenizer=tokenizer)
    (best / TASK_FILE).write_text(json.dumps(task_card(recipe, init_from), indent=2) + "\n", encoding="utf-8")
    final = task.model_class.from_pretrained(best).to(device)
    results = {"task": recipe.task, "init_from": init_from, "train_rows": len(rows), "steps": config.max_steps}
    for split in ("dev", "test"):
        if getattr(recipe.data, split):
            results[split] = task.evaluate(final, split, recipe.eval_batch_size, device)
    (run_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


def task_card(recipe: FinetuneRecipe, init_from: str) -> dict:
    """What `predict` needs besides the HF files: the task and how inputs were read and windowed."""
    return {"task": recipe.task, "init_from": init_from, "data": asdict(recipe.data)}


def schedule(training: TrainConfig, epochs: float, batches_per_epoch: int, has_dev: bool,
             default_metric: str) -> TrainConfig:
    """Steps from epochs, an evaluation (and checkpoint) every epoch, the task's metric for the best model."""
    steps_per_epoch = math.ceil(batches_per_epoch / training.grad_accumulation)
    values = asdict(training)
    if not values["max_steps"]:
        values["max_steps"] = max(1, round(epochs * steps_per_epoch))
    values["eval_every"] = values["eval_every"] or steps_per_epoch
    values["save_every"] = values["save_every"] or steps_per_epoch
    if has_dev and not values["best_metric"]:
        values["best_metric"] = default_metric
    if not has_dev:
        values["best_metric"], values["early_stopping_patience"] = "", 0
    return TrainConfig(**values)


ARCHITECTURE_TASKS = {"BertForSequenceClassification": "classification", "BertForTokenClassification": "ner",
                      "BertForQuestionAnswering": "qa"}


def load_for_prediction(folder: str | Path):
    """(task, model) for a fine-tuned folder: bertforge's task.json says how inputs were read;
    for a checkpoint fine-tuned elsewhere, the task follows config.json's architecture."""
    from ..models.checkpoint import resolve_checkpoint
    from ..models.config import BertConfig
    from . import TaskSettings

    folder = resolve_checkpoint(folder)
    config = BertConfig.from_json_file(folder / "config.json")
    card_path = folder / TASK_FILE
    if card_path.exists():
        card = json.loads(card_path.read_text(encoding="utf-8"))
        name, settings = card["task"], build(TaskSettings, card["data"], "task.json data")
    else:
        architecture = (config.architectures or ["BertModel"])[0]
        if architecture not in ARCHITECTURE_TASKS:
            raise ValueError(f"{folder} holds a {architecture}, not a fine-tuned model; predict needs one of "
                             f"{', '.join(ARCHITECTURE_TASKS)} (fine-tune it with `bertforge finetune`)")
        name, settings = ARCHITECTURE_TASKS[architecture], TaskSettings()
    task = load_task(name, settings, BertTokenizer.from_pretrained(folder), config)
    return task, task.model_class.from_pretrained(folder)
