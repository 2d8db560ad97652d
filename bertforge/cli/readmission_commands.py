"""The functions behind `bertforge readmission prepare|train|evaluate|report|score` (see commands.py)."""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..readmission.prepare import ReadmissionTask
from ..readmission.settings import ReadmissionRun


def readmission_prepare(*, output: str, admissions: str | None = None, notes: str | None = None,
                        generate: int = 0, tasks: list[ReadmissionTask] = ["discharge", "early-2", "early-3"],
                        seed: int = 0) -> None:
    """Build the readmission chunk datasets from MIMIC-III ADMISSIONS.csv and NOTEEVENTS.csv (or generated ones).

    Args:
        output: folder for <task>/{train,val,test}.csv and summary.json
        admissions: MIMIC-III ADMISSIONS.csv
        notes: MIMIC-III NOTEEVENTS.csv (streamed: the 4 GB file is never loaded whole)
        generate: instead of MIMIC-III, generate this many patients of MIMIC-schema data (marked generated)
        tasks: discharge (last discharge summary), early-2 and early-3 (notes of the first 2 / 3 days)
        seed: seed for the patient split, the balancing and (with --generate) the generated data
    """
    from ..readmission import generate_mimic, prepare

    if generate:
        files = generate_mimic(Path(output) / "generated-mimic", n_patients=generate, seed=seed)
        admissions, notes = str(files.admissions), str(files.noteevents)
        print(f"generated {generate} patients (not MIMIC-III data) in {Path(output) / 'generated-mimic'}")
    if not admissions or not notes:
        raise UsageError("give --admissions and --notes (MIMIC-III CSVs), or --generate N for generated data")
    report = prepare(admissions, notes, output, tasks=tuple(tasks), seed=seed)
    for key, value in sorted(report.counts.items()):
        print(f"{key:<40} {value:>10,}")
    print(f"wrote {output}/<task>/{{train,val,test}}.csv and {output}/summary.json")


def readmission_train(run: ReadmissionRun, *, overwrite: bool = False) -> None:
    """Train one readmission model on one task and score its test admissions (AUROC, AUPRC, RP80).

    Args:
        run: every field of ReadmissionRun is an option (--data, --task, --kind, --c, --eval-batch-size, ...)
        overwrite: delete a previous run in the output folder first
    """
    from ..readmission.recipe import run_readmission

    result = run_readmission(run, overwrite=overwrite)
    print(f"{result['model']} / {run.task} / seed {run.seed}: AUROC {result['auroc']:.3f}, "
          f"AUPRC {result['auprc']:.3f}, RP80 {result['rp80']:.3f} on {result['test_admissions']} test admissions")


def readmission_evaluate(*, model: str, data: str, task: ReadmissionTask = "discharge",
                         c: float | None = None, max_length: int = 0, device: str | None = None) -> None:
    """Score a fine-tuned readmission model on a task's test admissions (e.g. a discharge model on early notes).

    Args:
        model: a fine-tuned BertForSequenceClassification folder (a run's best/)
        data: the folder `readmission prepare` wrote
        task: the notes to score: the discharge summary, or those of the first 2 / 3 days
        c: the combination's scaling factor (default: the one the model was trained with, its task.json's; else 2)
        max_length: word pieces per chunk (0: what the model was trained on, its task.json's; else 512)
        device: cpu, cuda or cuda:N (default: this process's GPU if there is one, else the CPU)
    """
    from ..readmission.recipe import (BertChunkScorer, Chunks, load_readmission_model, score_admissions,
                                      trained_reading)
    from ..engine.devices import device_from_option

    chunks = Chunks.read(Path(data) / task / "test.csv")
    device = device_from_option(device)
    network, tokenizer = load_readmission_model(model, device)
    trained_length, trained_c = trained_reading(model, tokenizer)
    scorer = BertChunkScorer(tokenizer, max_length or trained_length)
    scored = score_admissions(chunks, scorer.probabilities(network, scorer.windows(chunks.texts), device),
                              trained_c if c is None else c)
    print(", ".join(f"{k} {v:.4f}" for k, v in scored["metrics"].items()) +
          f" on {len(scored['admissions'])} test admissions")


def readmission_report(runs: list[str], *, output: str) -> None:
    """Table 4 (model x task x AUROC/AUPRC/RP80, mean ± sd over seeds) and ROC / PR curves from finished runs.

    Args:
        runs: run folders (each with results.json and scores.csv), or folders holding them
        output: folder for table4.md, table4.csv and the curve PNGs
    """
    from ..readmission.recipe import write_report

    print(write_report([Path(r) for r in runs], Path(output)))


def readmission_score(notes: list[str], *, model: str, c: float | None = None, device: str | None = None) -> None:
    """Risk of 30-day readmission for a new admission, updated note by note, and the chunk that drove it.

    Args:
        notes: the admission's note files, in the order they were written
        model: a fine-tuned readmission model folder (a run's best/)
        c: the combination's scaling factor (default: the one the model was trained with, its task.json's; else 2)
        device: cpu, cuda or cuda:N (default: this process's GPU if there is one, else the CPU)
    """
    from ..input_files import open_text, require_file
    from ..readmission.recipe import admission_risk, load_readmission_model, trained_reading
    from ..engine.devices import device_from_option

    texts = []
    for note in notes:
        with open_text(require_file(note, "note file")) as file:
            texts.append(file.read())
        if not texts[-1].strip():
            raise ValueError(f"note file {note} is empty; give the admission's notes, one file per note")
    device = device_from_option(device)
    network, tokenizer = load_readmission_model(model, device)
    trained_length, trained_c = trained_reading(model, tokenizer)
    trace = admission_risk(network, tokenizer, texts, c=trained_c if c is None else c, max_length=trained_length,
                           device=device)
    for line in trace.lines(notes):
        print(line)
