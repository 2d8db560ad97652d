"""AdamW with BERT's weight-decay exclusions, and the learning-rate schedules: linear warm-up, then linear
decay (BERT's) or a constant rate (Adam as Keras runs it, for the word-level baselines)."""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

# BERT's optimizer skips decay on LayerNorm and biases (google-research/bert optimization.py).
NO_DECAY = ("bias", "LayerNorm.weight", "LayerNorm.bias")


def build_optimizer(model: nn.Module, learning_rate: float, weight_decay: float = 0.01,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                    fused: bool = False) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, decaying all but LayerNorm weights and biases.

    fused: one kernel updates every parameter (CUDA): at small batches the step is launch-bound,
    and the default (foreach) AdamW launches a dozen kernels per parameter group.
    """
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if name.endswith(NO_DECAY) else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=True if fused else None)


def warmup_steps_from(warmup: float, total_steps: int) -> int:
    """A warm-up given as a fraction of training (< 1) or as a number of steps."""
    return int(warmup * total_steps) if warmup < 1 else int(warmup)


def linear_warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """lr rises linearly to its peak over warmup_steps, then falls linearly to 0 at total_steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)


def warmup_then_constant(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """lr rises linearly to its peak over warmup_steps, then stays there."""
    return LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0)


def learning_rate_schedule(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int,
                           total_steps: int) -> LambdaLR:
    """The schedule named by TrainConfig.schedule (one of config.SCHEDULES; TrainConfig refuses any other)."""
    if schedule == "constant":
        return warmup_then_constant(optimizer, warmup_steps)
    return linear_warmup_decay(optimizer, warmup_steps, total_steps)


def epoch_schedule(training, epochs: float, batches_per_epoch: int, has_dev: bool, default_metric: str):
    """A TrainConfig counted in epochs: steps from epochs, an evaluation and checkpoint every epoch, and
    the task's metric for the best model (none without a dev set).

    The loop counts optimizer steps, and ends one at each epoch's last batch (the stream's `batches_left_in_epoch`):
    an epoch is ceil(batches / grad_accumulation) steps, its last one taking what is left, so step multiples of
    that are epoch ends. eval_every / save_every 0 (the default) mean every epoch here (TrainConfig's rule for a
    recipe counted in epochs); settings given explicitly (max_steps, eval_every, save_every, best_metric) are kept,
    so an eval_every past the run's last step evaluates only at the end.
    """
    steps_per_epoch = math.ceil(batches_per_epoch / training.grad_accumulation)
    best_metric = (training.best_metric or default_metric) if has_dev else ""
    return dataclasses.replace(
        training,
        max_steps=training.max_steps or max(1, round(epochs * steps_per_epoch)),
        eval_every=training.eval_every or steps_per_epoch,
        save_every=training.save_every or steps_per_epoch,
        best_metric=best_metric,
        early_stopping_patience=training.early_stopping_patience if has_dev else 0,
    )
