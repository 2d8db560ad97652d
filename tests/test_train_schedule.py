"""The loop's learning-rate schedules: linear warm-up, then linear decay (BERT's) or a constant rate."""
import pytest
import torch

from bertforge.train.config import TrainConfig
from bertforge.train.optim import learning_rate_schedule


def rates(schedule: str, warmup_steps: int, total_steps: int = 20) -> list[float]:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = learning_rate_schedule(optimizer, schedule, warmup_steps, total_steps)
    seen = []
    for _ in range(total_steps):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return seen


def test_constant_schedule_warms_up_then_keeps_the_peak_rate():
    constant = rates("constant", warmup_steps=4)
    assert constant[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert constant[4:] == pytest.approx([1e-3] * 16)
    assert rates("constant", warmup_steps=0) == pytest.approx([1e-3] * 20)
    # The default stays BERT's: the same warm-up, then down to 0 at the last step.
    linear = rates("linear", warmup_steps=4)
    assert linear[:4] == constant[:4] and linear[12] == pytest.approx(1e-3 * 8 / 16)


def test_an_unknown_schedule_is_refused_with_the_choices():
    assert TrainConfig().schedule == "linear"
    with pytest.raises(ValueError, match="schedule='cosine': use one of linear, constant"):
        TrainConfig(schedule="cosine")
