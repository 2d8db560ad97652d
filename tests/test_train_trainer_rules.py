"""The loop's rules where transformers' Trainer has one, kept to Trainer's: steps from a fraction (warm-up, epochs)
rounded up, weight decay spared by Trainer's names, max_grad_norm 0 as no clipping, greater_is_better inferred from
the metric's name, and a run extended on resume taking the stretched schedule's rate from its first step."""
import json
import logging
import math
import sys
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.adapt.mlm import MlmSettings
from bertforge.errors import BertforgeError, UsageError
from bertforge.readmission.baselines import BiLSTMClassifier, Vocabulary
from bertforge.settings import build
from bertforge.train import loop
from bertforge.train.checkpointing import TRAINER_STATE, latest_checkpoint, load_trainer_state
from bertforge.train.config import FinetuningConfig, TrainConfig
from bertforge.train.loop import best_model_tracker, optimizer_step, train
from bertforge.train.optim import (build_optimizer, decayed_names, epoch_schedule, learning_rate_schedule,
                                   warmup_steps_from)

sys.path.insert(0, str(Path(__file__).parent))
from tiny_training import random_batches, tiny_classifier  # noqa: E402


def quiet(folder: Path, **settings) -> TrainConfig:
    return TrainConfig(**{"output_dir": str(folder), "learning_rate": 1e-3, "save_every": 0, "eval_at_start": False,
                          "tensorboard": False, "plot": False, "device": "cpu", "precision": "fp32",
                          "cuda_graphs": False, "log_every": 1, **settings})


# ---------------------------------------------------------------- steps from a fraction: rounded up, as Trainer

@pytest.mark.parametrize("warmup, total, steps", [
    (0.29, 100, 29),  # int() gave 28
    (0.1, 9, 1),  # int() gave 0: no warm-up at all
    (0.1, 95, 10),
    (0.06, 50, 3),  # a whole product stays itself
    (0.07, 100, 7),  # 7.000000000000001: float error is no part of a step (Trainer's bare ceil says 8)
    (4, 100, 4), (2.5, 100, 2),  # a number of steps, as Trainer's int(warmup_steps)
])
def test_a_fraction_of_warmup_rounds_up_as_trainers_get_warmup_steps(warmup, total, steps):
    assert warmup_steps_from(warmup, total) == steps
    if warmup < 1 and (warmup, total) != (0.07, 100):
        assert steps == math.ceil(total * warmup)  # transformers' TrainingArguments.get_warmup_steps


@pytest.mark.parametrize("epochs, batches, accumulation, steps", [
    (2.5, 5, 1, 13),  # round() gave 12 (2.5 x 5 = 12.5, rounded to even)
    (1.5, 3, 1, 5),  # round() gave 4
    (0.5, 5, 1, 3),
    (2.5, 9, 2, 13),  # 5 steps an epoch, the last one short
    (0.3, 5, 1, 2),
    (1.1, 10, 1, 11),  # 11.000000000000002: 11, not 12
    (0.01, 5, 1, 1),  # at least a step
])
def test_fractional_epochs_round_up_as_trainer_everywhere_epochs_become_steps(epochs, batches, accumulation, steps):
    schedule = epoch_schedule(FinetuningConfig(grad_accumulation=accumulation), epochs, batches, has_dev=False,
                              default_metric="")
    assert schedule.max_steps == steps
    if (epochs, batches) not in ((1.1, 10), (0.01, 5)):
        assert steps == math.ceil(epochs * math.ceil(batches / accumulation))  # Trainer's num_train_epochs rule
    # adapt's continued MLM counts its epochs by the same rule (an epoch of batches of 4, its last one short)
    if accumulation == 1 and steps > 1:
        assert MlmSettings(epochs=epochs, batch_size=4).steps_for(4 * batches - 1) == steps


# ---------------------------------------------------------------- weight decay: Trainer's exclusions

def trainers_decayed(model: torch.nn.Module) -> set[str]:
    transformers = pytest.importorskip("transformers")
    # get_decay_parameter_names reads nothing of the Trainer: called unbound, its rule as Trainer runs it
    names = transformers.Trainer.get_decay_parameter_names(None, model)
    return {name for name, parameter in model.named_parameters() if name in names and parameter.requires_grad}


def optimizer_decays(model: torch.nn.Module) -> set[str]:
    decay_group = build_optimizer(model, 1e-3, weight_decay=0.01).param_groups[0]
    assert decay_group["weight_decay"] == 0.01
    decayed = {id(parameter) for parameter in decay_group["params"]}
    return {name for name, parameter in model.named_parameters() if id(parameter) in decayed}


def test_bert_decays_what_trainer_decays():
    """BERT's groups were already Trainer's (and Google's: no LayerNorm, no bias); kept so."""
    model = BertForPreTraining(BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=32))
    decayed = optimizer_decays(model)
    assert decayed == trainers_decayed(model) == decayed_names(model)
    assert not any("LayerNorm" in name or name.endswith("bias") for name in decayed)
    assert "bert.encoder.layer.0.attention.self.query.weight" in decayed


def test_an_lstms_biases_are_not_decayed():
    """A match on the name's end ("bias") decayed the readmission Bi-LSTM's bias_ih_l0, bias_hh_l0, ... ."""
    model = BiLSTMClassifier(Vocabulary.build(["a b c d e f"] * 3, min_count=1), 8, 8, 16, 0.0)
    decayed = optimizer_decays(model)
    assert decayed == trainers_decayed(model)
    assert not [name for name in decayed if "bias" in name] and "lstm.weight_ih_l0" in decayed


# ---------------------------------------------------------------- max_grad_norm 0: no clipping, at every door

def one_step(max_grad_norm: float) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    before = model.weight.detach().clone()
    ((model(torch.randn(8, 4)) - torch.randn(8, 1)) ** 2).mean().backward()
    optimizer_step(model, optimizer, scheduler, max_grad_norm)
    return model.weight.detach() - before


def test_max_grad_norm_0_is_no_clipping_through_the_api_and_the_recipe_alike():
    """TrainConfig(max_grad_norm=0) zeroed every gradient (clip_grad_norm_ to 0) and trained nothing, while a recipe
    refused 0; Trainer takes it as no clipping, and so do both doors now."""
    api = FinetuningConfig(max_grad_norm=0)
    recipe = build(FinetuningConfig, {"max_grad_norm": 0}, "training")
    assert api.max_grad_norm == recipe.max_grad_norm == 0
    unclipped = one_step(math.inf)
    assert unclipped.abs().max() > 0.01
    torch.testing.assert_close(one_step(0.0), unclipped, rtol=0, atol=0)
    assert one_step(1e-3).abs().max() < unclipped.abs().max()  # a norm still clips
    for door in (lambda: TrainConfig(max_grad_norm=-1.0), lambda: build(TrainConfig, {"max_grad_norm": -1}, "t")):
        with pytest.raises(UsageError, match=r"max_grad_norm must be at least 0, got -1(\.0)? \(0: no clipping\)"):
            door()


# ---------------------------------------------------------------- greater_is_better: by the metric's name when unset

@pytest.mark.parametrize("metric, given, greater", [
    ("mlm_loss", None, False), ("loss", None, False), ("mse", None, False), ("mae", None, False),
    ("accuracy", None, True), ("ndcg@10", None, True), ("auroc", None, True),
    ("mlm_loss", True, True), ("accuracy", False, False),  # given: kept
])
def test_greater_is_better_left_unset_follows_the_metrics_name(metric, given, greater):
    assert best_model_tracker(TrainConfig(best_metric=metric, greater_is_better=given)).greater_is_better is greater
    # A recipe's metric filled in by epoch_schedule (the task's default) is judged by its own name too
    filled = epoch_schedule(FinetuningConfig(greater_is_better=given), 3, 4, has_dev=True, default_metric=metric)
    assert best_model_tracker(filled).greater_is_better is greater


def test_a_loss_metric_keeps_the_lowest_loss_model(tmp_path):
    """Pretraining's best_metric mlm_loss with the default kept the model of the highest held-out loss."""
    losses = iter([3.0, 1.0, 2.0])
    train(tiny_classifier(), random_batches(), quiet(tmp_path, max_steps=6, eval_every=2, best_metric="mlm_loss"),
          evaluate=lambda model: {"mlm_loss": next(losses)})
    best = load_trainer_state(latest_checkpoint(tmp_path))["best"]
    assert (best["value"], best["step"], best["greater_is_better"]) == (1.0, 4, False)


def rewrite_config(checkpoint: Path, **settings) -> None:
    """The checkpoint as an older bertforge wrote it: greater_is_better recorded as its old default, true."""
    document = json.loads((checkpoint / TRAINER_STATE).read_text())
    document["config"].update(settings)
    (checkpoint / TRAINER_STATE).write_text(json.dumps(document))


@pytest.mark.parametrize("metric", ["", "accuracy"])
def test_a_run_recorded_with_the_old_default_resumes_where_it_judges_alike(tmp_path, metric):
    """The default went from true to unset; a run with no best_metric, or one better higher, goes on."""
    first = quiet(tmp_path, max_steps=2, eval_every=2, best_metric=metric)
    scores = lambda model: {"accuracy": 0.5}  # noqa: E731
    train(tiny_classifier(), random_batches(), first, evaluate=scores)
    rewrite_config(latest_checkpoint(tmp_path), greater_is_better=True)
    train(tiny_classifier(), random_batches(), quiet(tmp_path, max_steps=4, eval_every=2, best_metric=metric),
          evaluate=scores, resume=True)
    assert load_trainer_state(latest_checkpoint(tmp_path))["step"] == 4


def test_a_loss_run_recorded_with_the_old_default_says_how_to_go_on(tmp_path):
    """Its best model so far is the highest loss's: going on by the new default would mix the two, so the resume is
    refused in a line that says why and how to go on as it started (greater_is_better true) or start over."""
    scores = lambda model: {"loss": 1.0}  # noqa: E731
    train(tiny_classifier(), random_batches(), quiet(tmp_path, max_steps=2, eval_every=2, best_metric="loss"),
          evaluate=scores)
    rewrite_config(latest_checkpoint(tmp_path), greater_is_better=True)
    with pytest.raises(BertforgeError) as refused:
        train(tiny_classifier(), random_batches(), quiet(tmp_path, max_steps=4, eval_every=2, best_metric="loss"),
              evaluate=scores, resume=True)
    line = str(refused.value)
    assert "training.greater_is_better True -> False (left unset, it now follows best_metric's name" in line
    assert "set training.greater_is_better true to go on as it started" in line and "--overwrite" in line
    train(tiny_classifier(), random_batches(), quiet(tmp_path, max_steps=4, eval_every=2, best_metric="loss",
                                                     greater_is_better=True), evaluate=scores, resume=True)
    assert load_trainer_state(latest_checkpoint(tmp_path))["step"] == 4


# ---------------------------------------------------------------- resumed longer: the stretched schedule at once

def rates_of_steps(monkeypatch, config: TrainConfig, resume: bool) -> list[float]:
    """The learning rate each optimizer step of the run takes."""
    rates, build = [], loop.build_optimizer

    def spied(*args, **kwargs):
        optimizer = build(*args, **kwargs)
        optimizer.register_step_pre_hook(lambda opt, *_: rates.append(opt.param_groups[0]["lr"]))
        return optimizer

    monkeypatch.setattr(loop, "build_optimizer", spied)
    train(tiny_classifier(), random_batches(), config, resume=resume)
    return rates


def schedule_rates(warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler, rates = learning_rate_schedule(optimizer, "linear", warmup, total), []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_a_run_extended_on_resume_takes_the_stretched_schedules_rate_from_its_first_step(tmp_path, monkeypatch,
                                                                                          caplog):
    """The restored optimizer's rate was the old schedule's end: step 7 of a run of 6 extended to 12 ran at 0.0
    (the 12-step schedule's 6e-4) and only step 8 on followed the stretched schedule."""
    first = rates_of_steps(monkeypatch, quiet(tmp_path, max_steps=6, warmup=2), resume=False)
    assert first == pytest.approx(schedule_rates(2, 6))
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        resumed = rates_of_steps(monkeypatch, quiet(tmp_path, max_steps=12, warmup=2), resume=True)
    assert resumed == pytest.approx(schedule_rates(2, 12)[6:])
    assert resumed[0] == pytest.approx(6e-4)
    assert "step 7 runs at learning rate 0.0006 by this run's schedule (max_steps 12; the checkpoint's run had 6)" \
        in caplog.text


def test_a_resume_keeps_its_own_early_stopping_patience():
    """resume.py lets early_stopping_patience change on resume; the checkpoint's BestModel state overrode it."""
    from bertforge.train.best import BestModel

    saved = BestModel("accuracy", patience=2, value=0.8, step=10, evaluations_since_best=2)
    resumed = BestModel("accuracy", patience=5)
    resumed.load_state_dict(saved.state_dict())
    assert (resumed.patience, resumed.value, resumed.step, resumed.evaluations_since_best) == (5, 0.8, 10, 2)
    assert not resumed.should_stop  # two evaluations without a better one: the checkpoint's patience would stop here
