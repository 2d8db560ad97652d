"""AdamW with transformers' Trainer's weight-decay exclusions, gradient clipping, the learning-rate schedules:
linear warm-up, then linear decay (BERT's) or a constant rate (Adam as Keras runs it, for the word-level baselines),
and the steps a fraction of a run or of epochs comes to (Trainer's rule: rounded up)."""
from __future__ import annotations

import dataclasses
import math
import re

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

# transformers' Trainer's rule (Trainer.get_decay_parameter_names): no decay on a LayerNorm module's parameters, nor
# on any whose lower-cased name holds "bias" or a norm's name. On BERT it is BERT's own (google-research/bert
# optimization.py: LayerNorm and biases); it also spares an LSTM's biases (bias_ih_l0, ...), which a match on the
# name's end ("bias") missed.
NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def decayed_names(model: nn.Module) -> set[str]:
    """The names (as named_parameters gives them) of the parameters AdamW decays."""
    in_norms = {id(parameter) for module in model.modules() if isinstance(module, nn.LayerNorm)
                for parameter in module.parameters(recurse=False)}
    return {name for name, parameter in model.named_parameters()
            if id(parameter) not in in_norms and not NO_DECAY_NAME.search(name.lower())}


def build_optimizer(model: nn.Module, learning_rate: float, weight_decay: float = 0.01,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                    fused: bool = False) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, decaying all but LayerNorm weights and biases (`decayed_names`).

    fused: one kernel updates every parameter (CUDA): at small batches the step is launch-bound,
    and the default (foreach) AdamW launches a dozen kernels per parameter group.
    """
    decayed = decayed_names(model)
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (decay if name in decayed else no_decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=True if fused else None)


def clip_gradients(parameters, max_grad_norm: float) -> None:
    """Clip the gradients' total norm to max_grad_norm. 0 (or inf) clips nothing, as transformers' Trainer takes
    max_grad_norm <= 0: clip_grad_norm_ itself scales every gradient to 0 at a norm of 0."""
    if 0 < max_grad_norm < math.inf:
        torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)


def whole_steps(amount: float) -> int:
    """Steps counted as a product (a fraction of a run's steps, epochs of an epoch's) rounded up, as transformers'
    Trainer counts both (math.ceil: a part of a step is a step); a product within float error of a whole number is
    that number (1.1 * 10 is 11.000000000000002: 11 steps, not 12)."""
    nearest = round(amount)
    return nearest if math.isclose(amount, nearest, rel_tol=1e-12, abs_tol=1e-9) else math.ceil(amount)


def warmup_steps_from(warmup: float, total_steps: int) -> int:
    """A warm-up given as a fraction of training (< 1; rounded up, Trainer's get_warmup_steps: 0.1 of 9 steps is 1,
    not none) or as a number of steps."""
    return whole_steps(warmup * total_steps) if warmup < 1 else int(warmup)


def steps_for_epochs(epochs: float, steps_per_epoch: int) -> int:
    """The optimizer steps of `epochs` passes of `steps_per_epoch` each, rounded up (`whole_steps`: 2.5 epochs of 5
    steps are 13), at least 1. The one rule wherever a length in epochs becomes steps."""
    return max(1, whole_steps(epochs * steps_per_epoch))


def rates_of_schedule(scheduler: LambdaLR) -> None:
    """Set each parameter group's lr to the schedule's rate at the step it stands at (last_epoch: steps taken).

    For a resume: the optimizer's state brings back the rates the checkpoint's schedule gave its next step. A run
    extended on resume (max_steps or epochs raised) builds its schedule over the new length, and its next step must
    run at that schedule's rate; restored, it ran at the old one's (at the old end, 0) and only the step after
    followed the new one.
    """
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)


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
        max_steps=training.max_steps or steps_for_epochs(epochs, steps_per_epoch),
        eval_every=training.eval_every or steps_per_epoch,
        save_every=training.save_every or steps_per_epoch,
        best_metric=best_metric,
        early_stopping_patience=training.early_stopping_patience if has_dev else 0,
    )
