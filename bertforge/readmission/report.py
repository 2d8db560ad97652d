"""ClinicalBERT's Table 4 from per-seed results, and ROC / precision-recall curves of admission scores.

A result is one model trained with one seed on one task and scored on that task's test
admissions: {"model": str, "task": "discharge" | "early-2" | "early-3", "seed": int,
"auroc": float, "auprc": float, "rp80": float} (the metrics as `metrics.readmission_metrics`
returns them). Cells are the mean ± sample standard deviation over seeds, as the paper reports
"mean and standard deviation of 5 independent runs".
"""
import csv
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from sklearn import metrics as sk

from ..tasks.metrics import binary_labels
from ..atomic import replaced_file

TASK_TITLES = {"discharge": "Discharge summaries", "early-2": "2 days", "early-3": "3 days"}
METRIC_TITLES = {"auroc": "AUROC", "auprc": "AUPRC", "rp80": "RP80"}


def table4(results: Sequence[Mapping]) -> str:
    """Markdown table: one row per model (in order of first appearance), AUROC/AUPRC/RP80 per task.

    Only tasks present in results get columns, in the paper's order; a model without results
    for a task shows "–" there. Cells are "mean ± sd" (sd with ddof=1, three decimals), just the
    mean for one seed. A line under the table gives the number of seeds; when cells differ in
    it, each cell adds "(n=k)". Raises ValueError for malformed or duplicate results (see `table4_csv`).
    """
    summary = _summarise(results)
    tasks = [task for task in TASK_TITLES if any(key[1] == task for key in summary)]
    models = list(dict.fromkeys(key[0] for key in summary))
    seed_counts = {len(seeds) for seeds, _ in summary.values()}
    uniform = len(seed_counts) == 1

    header = ["Model"] + [f"{TASK_TITLES[task]} {title}" for task in tasks for title in METRIC_TITLES.values()]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|"]
    for model in models:
        cells = [model]
        for task in tasks:
            if (model, task) not in summary:
                cells += ["–"] * len(METRIC_TITLES)
                continue
            seeds, values = summary[(model, task)]
            suffix = "" if uniform else f" (n={len(seeds)})"
            cells += [_mean_sd(values[metric]) + suffix for metric in METRIC_TITLES]
        lines.append("| " + " | ".join(cells) + " |")
    if uniform:
        (count,) = seed_counts
        runs = f"{count} seed{'s' if count > 1 else ''} per cell"
    else:
        runs = "n seeds per cell as shown"
    lines.append("")
    lines.append(f"Mean ± sample standard deviation (ddof=1) over {runs}; AUROC, AUPRC (average precision) "
                 "and RP80 (recall at 80% precision) of admission scores on the test admissions.")
    return "\n".join(lines) + "\n"


def table4_csv(results: Sequence[Mapping], path: str | os.PathLike) -> Path:
    """One CSV row per model × task: model, task, seeds, <metric>_mean, <metric>_sd (empty for one seed); returns path.

    Raises ValueError for no results, a missing key, an unknown task, a non-finite metric, or
    the same (model, task, seed) twice.
    """
    summary = _summarise(results)
    path = Path(path)
    columns = ["model", "task", "seeds"] + [f"{metric}_{stat}" for metric in METRIC_TITLES for stat in ("mean", "sd")]
    with replaced_file(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        order = {task: i for i, task in enumerate(TASK_TITLES)}
        models = list(dict.fromkeys(key[0] for key in summary))
        for model, task in sorted(summary, key=lambda key: (models.index(key[0]), order[key[1]])):
            seeds, values = summary[(model, task)]
            row = [model, task, len(seeds)]
            for metric in METRIC_TITLES:
                mean, sd = _stats(values[metric])
                row += [repr(mean), "" if sd is None else repr(sd)]
            writer.writerow(row)
    return path


def plot_curves(curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path_roc: str | os.PathLike,
                path_pr: str | os.PathLike, title: str) -> tuple[Path, Path]:
    """ROC and precision-recall PNGs, one line per model with its AUROC / AUPRC in the legend; returns both paths.

    curves maps a model name to (labels (n,), scores (n,)) of the test admissions. The PR plot
    draws a dotted line at precision 0.8: RP80 is the highest recall of a curve point on or above it.
    AUPRC is average precision, as in `metrics.readmission_metrics`. Uses matplotlib's Agg
    canvas directly (no pyplot, no global backend switch). Raises ValueError for no curves or
    labels that are not 0/1 with both present.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not curves:
        raise ValueError("no curves to plot; pass {model name: (labels, scores)}")
    checked = {name: binary_labels(labels, scores, f"curve {name!r}: labels") for name, (labels, scores) in curves.items()}

    roc_figure, pr_figure = Figure(figsize=(5.5, 5)), Figure(figsize=(5.5, 5))
    FigureCanvasAgg(roc_figure), FigureCanvasAgg(pr_figure)
    roc_axes, pr_axes = roc_figure.subplots(), pr_figure.subplots()
    roc_axes.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="chance")
    for name, (labels, scores) in checked.items():
        false_positive_rate, true_positive_rate, _ = sk.roc_curve(labels, scores)
        roc_axes.plot(false_positive_rate, true_positive_rate,
                      label=f"{name} (AUROC {sk.roc_auc_score(labels, scores):.3f})")
        precision, recall, _ = sk.precision_recall_curve(labels, scores)
        pr_axes.step(recall, precision, where="post",
                     label=f"{name} (AUPRC {sk.average_precision_score(labels, scores):.3f})")
    pr_axes.axhline(0.8, color="grey", linestyle=":", linewidth=1.2, label="precision 0.8 (RP80)")

    for axes, figure, path, x_label, y_label, kind in (
            (roc_axes, roc_figure, path_roc, "False positive rate", "True positive rate", "ROC"),
            (pr_axes, pr_figure, path_pr, "Recall", "Precision", "Precision-recall")):
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1.05)
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.set_title(f"{title}: {kind}" if title else kind)
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right" if kind == "ROC" else "lower left", fontsize=8)
        figure.tight_layout()
        with replaced_file(path) as temporary:  # the temp name keeps .png: savefig picks the format from it
            figure.savefig(temporary, dpi=110)
    return Path(path_roc), Path(path_pr)


def _summarise(results: Sequence[Mapping]) -> dict[tuple[str, str], tuple[list[int], dict[str, list[float]]]]:
    """{(model, task): (seeds, {metric: values})} in order of first appearance, after checking every result."""
    if not results:
        raise ValueError("no results; pass dicts with model, task, seed, auroc, auprc, rp80")
    summary: dict[tuple[str, str], tuple[list[int], dict[str, list[float]]]] = {}
    for i, result in enumerate(results):
        missing = [key for key in ("model", "task", "seed", *METRIC_TITLES) if key not in result]
        if missing:
            raise ValueError(f"results[{i}] lacks {missing}")
        if result["task"] not in TASK_TITLES:
            raise ValueError(f"results[{i}] has unknown task {result['task']!r}; use one of {list(TASK_TITLES)}")
        seeds, values = summary.setdefault((str(result["model"]), result["task"]),
                                           ([], {metric: [] for metric in METRIC_TITLES}))
        if result["seed"] in seeds:
            raise ValueError(f"results[{i}] repeats seed {result['seed']} of {result['model']!r} on "
                             f"{result['task']!r}; each run must be counted once")
        seeds.append(result["seed"])
        for metric in METRIC_TITLES:
            value = float(result[metric])
            if not math.isfinite(value):
                raise ValueError(f"results[{i}][{metric!r}] is {value}; metrics must be finite")
            values[metric].append(value)
    return summary


def _stats(values: list[float]) -> tuple[float, float | None]:
    """(mean, sample sd) with ddof=1; sd None for one value."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), (float(values.std(ddof=1)) if values.size > 1 else None)


def _mean_sd(values: list[float]) -> str:
    mean, sd = _stats(values)
    return f"{mean:.3f}" if sd is None else f"{mean:.3f} ± {sd:.3f}"
