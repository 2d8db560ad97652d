"""Keep the best model by a held-out metric, and stop when it stops improving.

Fine-tuning evaluates on the dev split every epoch; the model that ships is the one with
the best dev score, not the last one (BERT's paper picks the best of its runs on dev).
The tracker's state travels in the training checkpoint, so a resumed run keeps comparing
against the best it has already seen.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

BEST_FOLDER = "best"


@dataclass
class BestModel:
    """The best score seen for `metric`, where, and how many evaluations since it improved."""

    metric: str
    greater_is_better: bool = True
    patience: int = 0  # evaluations without improvement before stopping; 0 never stops early
    value: float | None = None
    step: int | None = None
    evaluations_since_best: int = 0

    def update(self, scores: dict[str, float], step: int) -> bool:
        """Record one evaluation; returns True when it is a new best.

        Raises ValueError when the evaluation does not report the metric (a typo in the
        recipe would otherwise train for nothing and keep no model).
        """
        if self.metric not in scores:
            raise ValueError(f"best_metric={self.metric!r} is not among the evaluation's metrics {sorted(scores)}; "
                             "set training.best_metric to one of them")
        value = scores[self.metric]
        improved = math.isfinite(value) and (
            self.value is None or (value > self.value if self.greater_is_better else value < self.value))
        if improved:
            self.value, self.step, self.evaluations_since_best = value, step, 0
        else:
            self.evaluations_since_best += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.evaluations_since_best >= self.patience

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """The progress a checkpoint kept (the best score, its step, the evaluations since). `patience` stays this
        run's: a resume may change early_stopping_patience (resume.py allows it), and the checkpoint's overrode it."""
        for key, value in state.items():
            if key != "patience":
                setattr(self, key, value)


def best_model_folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / BEST_FOLDER
