"""The training loop's settings: `TrainConfig` (BERT's pretraining values) and `FinetuningConfig`.

Apart from loop.py, which needs torch, because their fields are command-line options (readmission
train's, through `ReadmissionRun`): building the command line's parser imports this module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from ..settings import PATH
from ..validation import check_value

Precision = Literal["auto", "fp32", "bf16"]  # auto: bf16 on a GPU, fp32 on CPU; bf16: autocast, on CPU and CUDA
Device = Literal["auto", "cuda", "cpu"]  # auto: the GPU when there is one; cpu under torchrun: gloo on the CPU
SCHEDULES = ("linear", "constant")  # optim.learning_rate_schedule builds each
# A best_metric ending in one of these is better lower (greater_is_better left unset). transformers' Trainer infers
# it from "loss" alone; mse and mae are added because regression fine-tuning reports them (tasks.metrics), and a
# best model by mse that kept the highest error would be Trainer's default's trap again.
LOWER_IS_BETTER = ("loss", "mse", "mae")


@dataclass
class TrainConfig:
    """The loop's knobs; defaults are BERT's pretraining values where it has one.

    Args:
        output_dir: the run folder (checkpoints, metrics.jsonl, best/)
        max_steps: optimizer steps to train (0 where a recipe counts epochs instead)
        learning_rate: the peak learning rate (AdamW)
        weight_decay: AdamW's decoupled weight decay (not on biases and LayerNorm)
        warmup: a fraction of max_steps (below 1, rounded up as transformers' Trainer: 0.1 of 9 steps is 1) or a
            number of steps; step n of the warm-up runs at n / warmup of the peak, so the first step learns
            (transformers' and Google's schedules run it at 0).
            The `lr` logged at a step is the next step's rate, as transformers' Trainer logs it
        schedule: after warm-up: linear (decay to 0 at max_steps, BERT's) or constant
        grad_accumulation: micro-batches per optimizer step (in a recipe counted in epochs, an epoch's last step
            takes only the micro-batches left in it: an epoch is one pass over the data)
        max_grad_norm: gradients are clipped to this norm; 0: no clipping (transformers' Trainer's rule)
        precision: auto (bf16 autocast on a GPU for models of BERT-base width and up and on a CPU with AMX, else
            fp32), fp32 or bf16
        device: auto (the GPU when there is one), cuda or cpu
        compile: torch.compile the model
        cuda_graphs: on a GPU, capture the training step once as a CUDA graph and replay it for every batch of
            the same shapes (one launch a step instead of ~1,000; pretraining pads its batches to one shape for
            it); one process, grad_accumulation 1 and no compile only, else (and with false) eager steps
        log_every: steps between log records
        eval_every: steps between evaluations, and one at the end. 0: at every epoch's end in the recipes counted
            in epochs (finetune, sbert train, readmission train), only at the end in pretrain (counted in steps);
            a number past the run's last step (1000000): only at the end in every recipe
        save_every: steps between checkpoints, and one at the end; 0 and larger numbers as eval_every
        keep_last: checkpoints kept (0 keeps every one)
        seed: the run's seed (data order, fresh weights, dropout)
        tensorboard: also write TensorBoard logs
        plot: draw curves.png at the end
        eval_at_start: evaluate before the first step (the starting point)
        best_metric: an evaluation key: keep the best model in output_dir/best
        greater_is_better: a higher best_metric is better; unset: false for a best_metric ending in loss, mse or mae
            (pretraining's mlm_loss, regression's errors; transformers' Trainer infers it from loss alone), else true
        early_stopping_patience: evaluations without a new best before stopping (0: never)
    """

    output_dir: str = field(default="runs/bert", metadata=PATH)  # a path: see settings.resolve_paths
    max_steps: int = 1000
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup: float = 0.01
    schedule: str = "linear"
    grad_accumulation: int = 1
    max_grad_norm: float = 1.0
    precision: Precision = "auto"
    device: Device = "auto"
    compile: bool = False
    cuda_graphs: bool = True
    log_every: int = 10
    eval_every: int = 0
    save_every: int = 0
    keep_last: int = 3
    seed: int = 0
    tensorboard: bool = True
    plot: bool = True
    eval_at_start: bool = True
    best_metric: str = ""
    greater_is_better: bool | None = None
    early_stopping_patience: int = 0

    def __post_init__(self) -> None:
        if self.precision not in get_args(Precision):
            raise ValueError(f"precision={self.precision!r}: use auto, fp32 or bf16 "
                             "(fp16 needs loss scaling, not supported)")
        if self.device not in get_args(Device):
            raise ValueError(f"device={self.device!r}: use auto, cuda or cpu")
        for name in ("max_steps", "grad_accumulation", "max_grad_norm"):  # for callers that skip settings.build
            if getattr(self, name) != math.inf:  # (max_grad_norm=inf, no clipping as 0, is the Python API's too)
                check_value(name, getattr(self, name), "training.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: use one of {', '.join(SCHEDULES)}")
        if self.early_stopping_patience and not self.best_metric:
            raise ValueError("early_stopping_patience needs best_metric: the metric whose improvement it waits for")


def higher_is_better(best_metric: str, greater_is_better: bool | None) -> bool:
    """greater_is_better, or when unset, what best_metric's name says (`LOWER_IS_BETTER`). Inferred where it is used,
    not in the settings: a best_metric filled in later (`epoch_schedule`: the task's) is judged by its own name."""
    if greater_is_better is not None:
        return greater_is_better
    return not best_metric.endswith(LOWER_IS_BETTER)


@dataclass
class FinetuningConfig(TrainConfig):
    """TrainConfig with BERT's fine-tuning values (Devlin et al. 2018, A.3: lr 2e-5 of its grid 5e-5 / 3e-5 / 2e-5,
    whose low end ClinicalBERT used; Google's run_classifier.py flag and transformers' Trainer default to 5e-5; 10%
    warm-up and weight decay 0.01 as Google's optimizer),
    counted in epochs (max_steps 0: `train.optim.epoch_schedule`; eval_every and save_every 0: every epoch), the best
    model by dev kept and one checkpoint.

    The one declaration of those values: finetune's and sbert train's `training` sections, readmission's
    run and adapt's stages start from it.
    """

    output_dir: str = field(default="runs/finetune", metadata=PATH)
    max_steps: int = 0
    learning_rate: float = 2e-5
    warmup: float = 0.1
    eval_at_start: bool = False
    keep_last: int = 1
