"""Gradient accumulation in a recipe counted in epochs: an optimizer step ends at the epoch's last batch
(transformers' Trainer's rule), so `epochs: 3` is three passes over the data, a short step's gradient is the mean
over the micro-batches it took, and a resumed run cuts its steps where the original did. Also the one rule for
eval_every / save_every 0 (every epoch where a recipe counts epochs, only at the end in pretraining)."""
import shutil
import sys
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.train.batches import ShuffledBatches
from bertforge.train.checkpointing import latest_checkpoint, list_checkpoints, load_trainer_state
from bertforge.train.config import FinetuningConfig, TrainConfig
from bertforge.train.loop import due_at, train
from bertforge.train.optim import epoch_schedule

sys.path.insert(0, str(Path(__file__).parent))
from tiny_training import tiny_classifier  # noqa: E402

EXAMPLES, EPOCHS = 10, 3


class Examples:
    """EXAMPLES rows whose second token names the row, and a record of the rows each micro-batch trained on."""

    def __init__(self):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(5, 50, (EXAMPLES, 8), generator=generator)
        self.ids[:, 1] = torch.arange(EXAMPLES) + 5
        self.labels = (self.ids[:, 0] > 25).long()
        self.seen: list[int] = []  # row numbers, in the order the loop trained on them
        self.at_evaluations: list[int] = []  # how many rows had been trained on at each evaluation

    def collate(self, rows: list[int]) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[rows], "attention_mask": torch.ones(len(rows), 8, dtype=torch.long),
                "labels": self.labels[rows]}

    def stream(self, batch_size: int) -> ShuffledBatches:
        return ShuffledBatches(EXAMPLES, batch_size, self.collate, seed=0)

    def statistics(self, batch, output) -> dict:  # the loop calls it for every micro-batch, in order
        self.seen.extend((batch["input_ids"][:, 1] - 5).tolist())
        return {}

    def evaluate(self, model) -> dict[str, float]:
        self.at_evaluations.append(len(self.seen))
        return {"accuracy": 0.5}


def finetuning(folder: Path, stream: ShuffledBatches, accumulation: int, **training) -> TrainConfig:
    """The settings `finetune` trains EPOCHS epochs with (train.optim.epoch_schedule), on the CPU in fp32."""
    base = FinetuningConfig(output_dir=str(folder), grad_accumulation=accumulation, learning_rate=1e-3,
                            device="cpu", precision="fp32", tensorboard=False, plot=False, log_every=1, **training)
    return epoch_schedule(base, EPOCHS, stream.batches_per_epoch, has_dev=False, default_metric="accuracy")


def run(folder: Path, batch_size: int, accumulation: int, examples: Examples | None = None, resume: bool = False,
        **training) -> tuple[torch.nn.Module, Examples, TrainConfig]:
    examples = examples or Examples()
    stream = examples.stream(batch_size)
    config = finetuning(folder, stream, accumulation, **training)
    model = tiny_classifier(dropout=0.0)  # no dropout: runs with other batch shapes draw the same (no) noise
    train(model, stream, config, statistics=examples.statistics, evaluate=examples.evaluate, resume=resume)
    return model, examples, config


@pytest.mark.parametrize("batch_size, accumulation, steps", [(8, 1, 6), (4, 2, 6), (2, 3, 6), (3, 4, 3)])
def test_epochs_are_passes_over_the_data_whatever_the_accumulation(tmp_path, batch_size, accumulation, steps):
    _, examples, config = run(tmp_path, batch_size, accumulation)
    assert config.max_steps == steps
    assert len(examples.seen) == EPOCHS * EXAMPLES  # 4 x 2 took 12 micro-batches of 4: 4 epochs
    for epoch in range(EPOCHS):
        assert sorted(examples.seen[epoch * EXAMPLES:(epoch + 1) * EXAMPLES]) == list(range(EXAMPLES))
    assert examples.at_evaluations == [EXAMPLES, 2 * EXAMPLES, 3 * EXAMPLES]  # "every epoch": at epoch ends
    batches_per_epoch = -(-EXAMPLES // batch_size)
    assert load_trainer_state(latest_checkpoint(tmp_path))["data"] == {"epoch": EPOCHS - 1,
                                                                       "batches_done": batches_per_epoch}


def test_a_short_last_step_is_the_mean_over_the_micro_batches_it_took(tmp_path):
    """4 x 2 over 10 examples: each epoch's steps are 8 examples (two means of 4 = the mean of 8) and 2 (one
    micro-batch, not halved): the very steps of 8 x 1, whose epochs are the same permutations."""
    accumulated, _, _ = run(tmp_path / "accumulated", 4, 2)
    whole, _, _ = run(tmp_path / "whole", 8, 1)
    for name, value in whole.state_dict().items():
        torch.testing.assert_close(accumulated.state_dict()[name], value, rtol=0, atol=1e-6, msg=name)


def test_a_run_resumed_after_a_step_before_a_short_one_trains_what_an_uninterrupted_one_does(tmp_path):
    straight, examples, _ = run(tmp_path / "straight", 4, 2, keep_last=0, save_every=1)
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "straight", cut)
    for checkpoint in list_checkpoints(cut):
        if int(checkpoint.name.split("-")[1]) > 3:
            shutil.rmtree(checkpoint)  # killed after step 3: epoch 2's first step; its second takes 1 micro-batch
    assert load_trainer_state(latest_checkpoint(cut))["data"] == {"epoch": 1, "batches_done": 2}
    again = Examples()
    resumed, again, _ = run(cut, 4, 2, examples=again, resume=True, keep_last=0, save_every=1)
    # epoch 2's last batch, then epoch 3
    assert again.seen == examples.seen[-len(again.seen):] and len(again.seen) == 2 + EXAMPLES
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_every_process_under_torchrun_ends_its_steps_at_the_same_batch():
    ranks = [ShuffledBatches(EXAMPLES, 2, lambda rows: rows, seed=0, rank=rank, world_size=2) for rank in (0, 1)]
    assert ranks[0].batches_per_epoch == 3  # 4 examples a step over the two processes
    for stream in ranks:
        positions = [{"epoch": 0, "batches_done": 0}]
        for _ in zip(range(4), stream):
            positions.append(stream.state_dict())
        # before any batch, after each of the epoch's 3, then the next epoch's first
        assert [stream.batches_left_in_epoch(position) for position in positions] == [3, 2, 1, 3, 2]


# ---------------------------------------------------------------- eval_every / save_every 0: one rule, documented

def due_steps(config: TrainConfig) -> tuple[list[int], list[int]]:
    """The steps (evaluations, checkpoints) the loop makes with `config`."""
    dues = {step: due_at(step, config, False, True, torch.device("cpu")) for step in range(1, config.max_steps + 1)}
    return [s for s, due in dues.items() if due.evaluating], [s for s, due in dues.items() if due.saving]


def test_zero_is_every_epoch_in_a_recipe_counted_in_epochs_and_the_end_in_pretraining():
    counted_in_epochs = epoch_schedule(FinetuningConfig(), EPOCHS, 3, has_dev=True, default_metric="accuracy")
    assert (counted_in_epochs.eval_every, counted_in_epochs.save_every) == (3, 3)
    assert due_steps(counted_in_epochs) == ([3, 6, 9], [3, 6, 9])
    assert due_steps(TrainConfig(max_steps=9)) == ([9], [9])  # pretrain: its TrainConfig as given
    past_the_end = FinetuningConfig(eval_every=1_000_000, save_every=1_000_000)  # only at the end, as documented
    assert due_steps(epoch_schedule(past_the_end, EPOCHS, 3, has_dev=True, default_metric="accuracy")) == ([9], [9])


def test_the_help_says_what_zero_does_in_each_kind_of_recipe(capsys):
    main(["readmission", "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    eval_every = text[text.index("--eval-every EVAL_EVERY steps"):text.index("--save-every SAVE_EVERY steps")]
    assert "0: at every epoch's end in the recipes counted in epochs (finetune, sbert train, readmission train)" \
        in eval_every
    assert "only at the end in pretrain" in eval_every and "past the run's last step" in eval_every
    assert "only at the end)" not in eval_every
