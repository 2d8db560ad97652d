"""The fine-tuning commands: `finetune`, `predict` with what it trained, and `baseline`, the TF-IDF + logistic
regression the same files are scored with. finetune and baseline read one recipe (`finetune_recipe`)."""
from __future__ import annotations

import json

from ..atomic import write_text
from ..errors import UsageError
from ..tasks import TaskName


def finetune(*overrides: str, task: TaskName | None = None, data: str | None = None, dev: str | None = None,
             test: str | None = None, init_from: str | None = None, output: str | None = None,
             text_columns: list[str] | None = None, label_column: str | None = None, config: str | None = None,
             resume: bool = False, overwrite: bool = False, print_config: bool = False) -> None:
    """Fine-tune a checkpoint for classification, NER or question answering; keep the best model on dev.

    Args:
        overrides: section.key=value settings, e.g. epochs=2 training.learning_rate=3e-5 data.max_length=256
        task: classification (CSV/TSV/JSONL), ner (CoNLL) or qa (SQuAD JSON); default: the recipe's, else classification
        data: the training file
        dev: the dev file (evaluated every epoch; the best model is kept)
        test: the test file (scored once with the best model)
        init_from: the checkpoint to start from (folder or packaged short name); default minilm
        output: the run folder (best model in OUTPUT/best, metrics in OUTPUT/results.json)
        text_columns: classification: the text column, or two for text pairs (default: text)
        label_column: classification: the label column (default: label)
        config: a recipe YAML with these settings (flags and overrides take precedence)
        resume: continue the run in the output folder from its latest checkpoint
        overwrite: delete a previous run in the output folder and start afresh
        print_config: print the recipe with every setting (file, flags and overrides applied) as YAML and exit
    """
    from ..settings import recipe_yaml
    from ..tasks.finetune import run_finetuning
    from ..train.runner import run_summary

    recipe = finetune_recipe(config, overrides, {
        "task": task, "init_from": init_from, "data.train": data, "data.dev": dev, "data.test": test,
        "data.text_columns": text_columns, "data.label_column": label_column, "training.output_dir": output})
    columns = [name for name, value in (("--text-columns", text_columns), ("--label-column", label_column)) if value]
    if columns and recipe.task != "classification":  # a CoNLL or SQuAD file has no columns to name: it trained as if
        raise UsageError(f"{' and '.join(columns)} {'name' if len(columns) > 1 else 'names'} a table's columns, "
                         f"which a {recipe.task} file does not have (CoNLL, SQuAD JSON); leave it out")
    if print_config:
        print(recipe_yaml(recipe), end="")
        return
    print("\n".join(run_summary(run_finetuning(recipe, resume=resume, overwrite=overwrite), recipe.training)))


def finetune_recipe(config: str | None, overrides: tuple[str, ...], flags: dict):
    """The FinetuneRecipe of a command line: recipe file, then flags, then overrides (`settings.load_recipe`)."""
    from ..settings import load_recipe
    from ..tasks.finetune import FinetuneRecipe

    return load_recipe(FinetuneRecipe, config, flags, list(overrides))


def predict(*, model: str, input: str, output: str, batch_size: int = 64, device: str | None = None) -> None:
    """Predict with a fine-tuned model: a CSV/TSV/JSONL (classification) or CoNLL (NER) or SQuAD file in,
    predictions with probabilities out.

    Args:
        model: a folder written by `bertforge finetune` (its best/ folder) or any fine-tuned HF BERT checkpoint
        input: the file to predict on (the columns the model was trained with; labels not needed)
        output: where to write predictions: .csv, .tsv or .jsonl (NER also .conll; QA .json)
        batch_size: rows per forward pass
        device: cpu, cuda or cuda:N (default: this process's GPU if there is one, else the CPU)
    """
    from ..input_files import require_file
    from ..tasks.finetune import load_for_prediction
    from ..engine.devices import device_from_option

    require_file(input)
    where = device_from_option(device)  # a wrong --device is said before the model loads
    task, network = load_for_prediction(model)
    count = task.predict_file(network.to(where), input, output, batch_size=batch_size, device=where)
    print(f"wrote {count:,} predictions to {output}")


def baseline(*overrides: str, data: str | None = None, dev: str | None = None, test: str | None = None,
             text_columns: list[str] | None = None, label_column: str | None = None, config: str | None = None,
             output: str | None = None, seed: int | None = None, print_config: bool = False) -> None:
    """TF-IDF + logistic regression on the same classification files: the honest baseline to beat.

    Args:
        overrides: data.key=value settings, e.g. data.problem_type=regression
        data: the training file (CSV/TSV/JSONL)
        dev: the dev file
        test: the test file
        text_columns: the text column, or two for text pairs (default: text)
        label_column: the label column (default: label)
        config: a fine-tuning recipe YAML whose data section to use (flags take precedence)
        output: also write the metrics to this JSON file
        seed: seed for the cross-validation folds (default: the recipe's training.seed, else 0)
        print_config: print the data section and the seed (file, flags and overrides applied) as YAML and exit
    """
    from ..settings import recipe_yaml
    from ..tasks.classification.tfidf import run_baseline
    from ..train.runner import split_metrics

    recipe = finetune_recipe(config, overrides, {"data.train": data, "data.dev": dev, "data.test": test,
                                                 "data.text_columns": text_columns, "data.label_column": label_column,
                                                 "training.seed": seed})
    if print_config:  # the seed too (a recipe's training.seed): the printed file gives the same folds
        print(recipe_yaml({"data": recipe.data, "training": {"seed": recipe.training.seed}}), end="")
        return
    if not (recipe.data.dev or recipe.data.test):
        raise UsageError("give --dev or --test (or data.dev / data.test in the recipe): the baseline is scored on "
                         "them; with the training file alone there is nothing to report")
    results = run_baseline(recipe.data, seed=recipe.training.seed)
    for line in split_metrics(results):
        print(line)
    if output:
        write_text(output, json.dumps(results, indent=2) + "\n")
