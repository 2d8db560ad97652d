"""Bounds on every numeric setting and option, declared once by name.

A setting means the same thing wherever it appears (`batch_size` in a recipe, on the command
line, in a readmission run, as a Python argument), so its valid range is declared once here, keyed
by its name, and checked at each edge: recipe dataclasses (`settings.build`), command-line options
(the parser's types), `__post_init__` of the recipe dataclasses and the Python API's arguments
(`checked`, which also refuses a value of the wrong type). A numeric setting without an entry is a
test failure (tests/test_reliability_inputs.py), so new ones get a bound.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class Bound:
    """minimum <= value (< or <= maximum); `above` makes the minimum exclusive; `meaning` explains special values."""

    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    meaning: str = ""

    def problem(self, value: float) -> str | None:
        """Why `value` is out of range (None when it is in range)."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if self.minimum is not None and (value <= self.minimum if self.above else value < self.minimum):
            rule = f"greater than {self.minimum:g}" if self.above else f"at least {self.minimum:g}"
        elif self.maximum is not None and value > self.maximum:
            rule = f"at most {self.maximum:g}"
        else:
            return None
        return f"must be {rule}, got {value!r}" + (f" ({self.meaning})" if self.meaning else "")

    def __str__(self) -> str:
        """The range in words, as a command's help shows it: 'at least 1', 'greater than 0, at most 1'."""
        rules = [f"{'greater than' if self.above else 'at least'} {self.minimum:g}"] if self.minimum is not None else []
        return ", ".join(rules + ([f"at most {self.maximum:g}"] if self.maximum is not None else []))


POSITIVE = Bound(1)
COUNT = Bound(0)
PROBABILITY = Bound(0, 1)

BOUNDS: dict[str, Bound] = {
    # sizes and counts
    "batch_size": POSITIVE, "eval_batch_size": POSITIVE, "eval_batches": POSITIVE,
    "grad_accumulation": POSITIVE, "log_every": POSITIVE, "top_k": POSITIVE,
    "max_query_length": POSITIVE, "n_best_size": POSITIVE, "max_answer_length": POSITIVE,
    "max_predictions_per_seq": POSITIVE, "shuffle_window": POSITIVE, "dupe_factor": POSITIVE,
    "model_max_length": POSITIVE, "doc_stride": POSITIVE, "matryoshka_dims": POSITIVE,
    "mini_batch_size": Bound(0, meaning="0: no gradient cache"),
    "max_batch_tokens": Bound(2, meaning="[CLS] and [SEP]"),
    "max_seq_length": Bound(5, meaning="[CLS] A [SEP] B [SEP] with a token in each segment"),
    "vocab_size": Bound(6, meaning="the 5 special tokens and at least one piece"),
    "max_steps": Bound(0, meaning="0 only where a recipe derives the steps from epochs"),
    "eval_every": Bound(0, meaning="0: every epoch where a recipe counts epochs, else only at the end"),
    "save_every": Bound(0, meaning="0: every epoch where a recipe counts epochs, else only at the end"),
    "keep_last": Bound(0, meaning="0 keeps every checkpoint"),
    "early_stopping_patience": Bound(0, meaning="0 never stops early"),
    "max_length": Bound(0, meaning="0: the task's or model's default"),
    "stride": Bound(-1, meaning="-1: the task's default"), "max_windows": Bound(0, meaning="0: every window"),
    "min_frequency": COUNT, "num_unused": COUNT, "generate": Bound(0, meaning="0: read MIMIC-III files instead"),
    "seed": Bound(0, 2**32 - 1),
    # search and word senses
    "chunk_size": POSITIVE, "examples": COUNT, "max_occurrences": Bound(2),
    "effort": Bound(1, meaning="an ivf index's nprobe, an hnsw index's efSearch"),
    "dense_weight": Bound(0, 1, meaning="the encoder's share of a hybrid ranking: 1 the encoder alone, 0 BM25 alone"),
    "sentence_weight": Bound(0, 1, meaning="the best sentence's share of the dense score: 0 the passage vector alone"),
    "neighbour_weight": Bound(0, 1, meaning="the best neighbour's share of a passage's score: 0 the passage alone"),
    "max_senses": Bound(2, meaning="one sense needs no clustering"),
    # serving
    "port": Bound(0, 65535, meaning="0 picks a free port"),
    "max_concurrent_requests": POSITIVE, "max_input_length": POSITIVE, "max_client_batch_size": POSITIVE,
    "payload_limit": Bound(1024, meaning="room for one JSON request"), "max_batch_requests": POSITIVE,
    "body_timeout_seconds": Bound(0, above=True), "threads": POSITIVE,
    "minutes": Bound(0, above=True, meaning="adapt's time budget"),
    # rates and amounts
    "epochs": Bound(0, above=True), "learning_rate": Bound(0, 1, above=True), "weight_decay": Bound(0, 1),
    "warmup": Bound(0, meaning="a fraction of max_steps below 1, else a number of steps"),
    "max_grad_norm": Bound(0, meaning="0: no clipping"), "c": Bound(0, above=True), "combine_c": Bound(0, above=True),
    "scale": Bound(0, above=True, meaning="1 / temperature"), "distillation": Bound(0, meaning="0: no teacher term"),
    "distill_documents": Bound(0, meaning="0: the teacher's pair rankings only"),
    "short_seq_prob": PROBABILITY, "mlm_probability": Bound(0, 1, above=True),
}
# max_steps where nothing derives it from epochs (pretraining, the loop itself): BOUNDS allows 0 for the rest.
STEPS_TO_RUN = Bound(1, meaning="a run that is not counted in epochs needs a number of steps")


def check_value(name: str, value, where: str = "") -> None:
    """Raise UsageError naming `where + name` when a numeric value is outside the bounds declared for `name`."""
    check_bound(BOUNDS.get(name), name, value, where)


def check_bound(bound: Bound | None, name: str, value, where: str = "") -> None:
    """Raise UsageError naming `where + name` when a numeric value is outside `bound` (None: no bound)."""
    if bound is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    problem = bound.problem(value)
    if problem:
        raise UsageError(f"{where}{name} {problem}")


def checked(name: str, value, kind: type = int, bound: Bound | None = None, where: str = ""):
    """`value` of a Python API argument when it is an int (kind=float: any real number) within the bound
    declared for `name` (or `bound`, where the range depends on other arguments); else UsageError.

    The API's counterpart of the command line's typed options: a caller can pass anything (2.5, "3", True).
    A numpy scalar counts as the number it holds and comes back as a Python int / float.
    """
    if type(value) is not kind:  # (the plain case skips the slower abstract-class checks: masking calls this a lot)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral if kind is int else numbers.Real):
            raise UsageError(f"{where}{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
        value = kind(value)
    check_bound(bound or BOUNDS[name], name, value, where)
    return value


def check_fields(instance, where: str = "") -> None:
    """check_value on every field of a dataclass instance (nested dataclasses are checked where they are built)."""
    for field in dataclasses.fields(instance):
        check_value(field.name, getattr(instance, field.name), where)
