"""Where a run's numbers go: a JSONL file always, TensorBoard and a PNG of the curves when installed."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..atomic import replaced_file, write_lines

logger = logging.getLogger("bertforge")
METRICS_FILE = "metrics.jsonl"


class RunLog:
    """Appends one JSON record per log step; on resume, drops records past the resumed step."""

    def __init__(self, run_dir: Path, resume_step: int = 0, tensorboard: bool = True):
        self.path = run_dir / METRICS_FILE
        run_dir.mkdir(parents=True, exist_ok=True)
        kept = [r for r in self.records() if r["step"] <= resume_step] if resume_step else []
        write_lines(self.path, map(json.dumps, kept))  # atomically: a kill here keeps the old file
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step or None)
            except ImportError:  # tensorboard is optional; JSONL carries the same numbers
                pass

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path) if self.path.exists() else []

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def plot_curves(metrics_file: Path, output: Path) -> Path | None:
    """Loss and accuracy curves (train and eval) as a PNG; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no curve PNG (pip install matplotlib)")
        return None
    records = read_records(metrics_file)
    losses = sorted({k for r in records for k in r if k.endswith("loss")})
    accuracies = sorted({k for r in records for k in r if k.endswith("accuracy")})
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, keys, title in ((axes[0], losses, "loss"), (axes[1], accuracies, "accuracy")):
        for key in keys:
            points = [(r["step"], r[key]) for r in records if key in r]
            ax.plot(*zip(*points), marker="o" if key.startswith("eval") else None, markersize=3, label=key)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if keys:
            ax.legend()
    figure.tight_layout()
    with replaced_file(output) as temporary:
        figure.savefig(temporary, dpi=110)
    plt.close(figure)
    return output


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file. A process killed while appending leaves at most its last line
    half-written: that line is dropped (with a warning), not a reason to refuse the whole run."""
    lines = [(number, line) for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if line.strip()]
    records = []
    for position, (number, line) in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if position < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record; the metrics file is damaged") from None
            logger.warning("%s: dropped its half-written last line (the run was killed while logging)", path)
    return records
