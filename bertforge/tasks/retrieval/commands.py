"""`bertforge sbert train|evaluate|prepare`: the sentence-encoder sub-commands (signatures are the CLI, see cli/parser.py)."""
from __future__ import annotations

import json
from pathlib import Path

from ...atomic import write_text


def train(*overrides: str, config: str, init_from: str | None = None, output: str | None = None,
          resume: bool = False, overwrite: bool = False, print_config: bool = False) -> None:
    """Train a sentence encoder (bi-encoder) from a recipe; the result is a sentence-transformers folder.

    Args:
        config: the recipe YAML (see recipes/sbert-*.yaml)
        overrides: section.key=value settings, e.g. loss.loss=cosent epochs=2 training.max_steps=100
        init_from: start from this checkpoint (folder or packaged short name) instead of the recipe's
        output: the run folder (model in OUTPUT/best, metrics in OUTPUT/results.json)
        resume: continue the run in the output folder from its latest checkpoint
        overwrite: delete a previous run in the output folder and start afresh
        print_config: print the recipe with every setting (file, flags and overrides applied) as YAML and exit
    """
    from ...settings import recipe_yaml
    from ...train.runner import run_summary
    from .recipe import SbertRecipe, run_sbert_training

    recipe = SbertRecipe.from_file(config, list(overrides), flags={"init_from": init_from, "training.output_dir": output})
    if print_config:
        print(recipe_yaml(recipe), end="")
        return
    results = run_sbert_training(recipe, resume=resume, overwrite=overwrite)
    print("\n".join(run_summary(results, recipe.training, "model (sentence-transformers folder)")))


def evaluate(*, model: str, data: str, output: str | None = None, batch_size: int = 64,
             device: str | None = None) -> None:
    """Score a sentence encoder, or the bm25 / tfidf baseline, on a retrieval set or scored pairs.

    Args:
        model: a sentence-transformers folder, any BERT checkpoint (mean pooling), a packaged short name, or bm25 / tfidf
        data: a BEIR folder (queries.jsonl, corpus.jsonl, qrels.tsv): recall@1/10, MRR@10, nDCG@10; or a scored-pairs file (sentence1, sentence2, score): Spearman
        output: also write the metrics to this JSON file
        batch_size: texts per forward pass
        device: cpu, cuda or cuda:N for an encoder (default: this process's GPU if there is one, else the CPU)
    """
    from ...engine.devices import device_from_option
    from ...models.folder import read_model_folder
    from ...resources import resolve_model
    from ...tokenization.folder import load_tokenizer
    from .baselines import BASELINES
    from .bi_encoder import BiEncoder
    from .evaluation import evaluate_retrieval
    from .reader import SentencePairs
    from .recipe import evaluate_held_out, load_held_out

    held_out = load_held_out(data)
    if model in BASELINES:
        if isinstance(held_out, SentencePairs):
            raise ValueError(f"{model} is a retrieval baseline; scored pairs are evaluated with an encoder")
        metrics = evaluate_retrieval(BASELINES[model], held_out)
    else:
        folder = read_model_folder(resolve_model(model))
        encoder = BiEncoder.from_pretrained(folder).to(device_from_option(device))  # its Embedder runs where it is
        metrics = evaluate_held_out(encoder, load_tokenizer(folder), held_out, batch_size)
    print(", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if output:
        write_text(output, json.dumps(metrics, indent=2) + "\n")


def prepare(name: str, *, output: str, data: str | None = None) -> None:
    """Write a committed retrieval set's files (training rows, dev/test in BEIR layout) from the demo data.

    Args:
        name: drug-reviews, austen or tweets (the ids are in data/retrieval/NAME.json)
        output: folder for train.jsonl, {dev,test}/ and the scored-pairs files
        data: the data folder the texts are read from (default: $BERTFORGE_DATA, the project's data/, ../shared/data)
    """
    from .sets import load_split_ids, prepare_set

    counts = prepare_set(load_split_ids(name), Path(data) if data else None, Path(output))
    for file, rows in counts.items():
        print(f"{file:<24} {rows:>7,}")
