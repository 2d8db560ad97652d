"""Many variants of adapt's quick recipe on one corpus, each a real `run_adapt` with its ICT stage's settings changed.

    python scripts/adapt_sweep.py runs/retrieval/python-faq/corpus.jsonl --eval runs/retrieval/python-faq \
        --root /tmp/sweep --results sweep.jsonl reference lr=5e-5 "distillation=0.5,scale=40" epochs*=2

Each variant is `key=value` pairs (MethodSettings fields; `key*=f` multiplies the preset's value) or `reference`
(the preset unchanged). A variant runs the whole pipeline (held-out queries, BM25 and base baselines, the stage
with its own evaluations and fusion weight, the report) in ROOT/NAME, without its index: the index adds no number,
and on a machine without FAISS the sweep still runs. One JSON line per variant (nDCG@10 of BM25, the base, the
stage alone and fused, on ICT dev/test and the --eval set) goes to --results as it finishes. Where the GPU makes a
run a minute long this is how the preset's knobs are chosen; dev picks, test and --eval report.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from bertforge.adapt import pipeline
from bertforge.adapt.methods import MethodSettings
from bertforge.adapt.report import engine
from bertforge.errors import UsageError
from bertforge.validation import checked

FIELDS = {field.name for field in dataclasses.fields(MethodSettings)}
PLANNED_STAGES = pipeline.with_lexical_teacher  # the last step of planning the stages


def parsed_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def changed(settings: MethodSettings, variant: str) -> MethodSettings:
    if variant == "reference":
        return settings
    for pair in variant.split(","):
        key, value = pair.split("=", 1)
        scaled = key.endswith("*")
        key = key.rstrip("*")
        if key not in FIELDS:
            raise SystemExit(f"{key!r} is not a MethodSettings field ({', '.join(FIELDS)})")
        value = parsed_value(value)
        settings = dataclasses.replace(settings, **{key: getattr(settings, key) * value if scaled else value})
    return settings


def with_variant(variant: str):
    """The pipeline's planned stages with each ICT stage changed by `variant`: applied after the hybrid teacher's
    share is set, so `distill_lexical` is a knob too (the pipeline reads the function by its module name)."""
    def planned(stages, base_dense_weight: float):
        return [(name, changed(settings, variant) if settings.method == "ict" else settings)
                for name, settings in PLANNED_STAGES(stages, base_dense_weight)]
    return planned


def scores(metrics: dict) -> dict:
    return {split: round(values["ndcg@10"], 4) for split, values in metrics.items()}


def summary(variant: str, report: dict, seconds: float) -> dict:
    systems = {system["name"]: system for system in report["systems"]}
    row = {"variant": variant, "seconds": round(seconds, 1), "bm25": scores(systems["bm25"]["metrics"]),
           "base": scores(systems["base"]["metrics"]), "base_fused": scores(engine(systems["base"])["metrics"])}
    for name, system in systems.items():
        if name not in ("bm25", "base"):
            row[name] = {"alone": scores(system["metrics"]), "fused": scores(engine(system)["metrics"]),
                         "dense_weight": engine(system)["dense_weight"], "steps": system.get("steps"),
                         "best_step": system.get("best_step"), "description": system.get("description")}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="+", help="corpus files, then the variants (key=value,... or reference)")
    parser.add_argument("--eval", default=None)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--root", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=None, help="the run's time budget (default: the preset's)")
    args = parser.parse_intermixed_args()
    if args.minutes is not None:
        try:
            checked("minutes", args.minutes, float)  # adapt's own bound: a budget above 0
        except UsageError as error:
            parser.error(str(error))
    corpus = [item for item in args.corpus if "=" not in item and item != "reference"]
    variants = [item for item in args.corpus if item not in corpus]
    pipeline.require_index_library = lambda: None
    pipeline.build_corpus_index = lambda run, *weights: None
    for variant in variants:
        pipeline.with_lexical_teacher = with_variant(variant)
        name = "".join(c if c.isalnum() or c in ".-" else "_" for c in variant)
        options = pipeline.AdaptOptions(corpus=corpus, output=str(Path(args.root) / name), eval=args.eval,
                                        text_column=args.text_column, seed=args.seed,
                                        minutes=args.minutes)
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        started = time.time()
        row = summary(variant, pipeline.run_adapt(options), time.time() - started)
        row["seed"] = args.seed
        with open(args.results, "a") as file:
            file.write(json.dumps(row) + "\n")
        print("SWEEP", json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
