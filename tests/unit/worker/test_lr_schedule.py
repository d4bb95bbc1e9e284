"""Linear learning-rate scaling with gradual warmup, and the time-to-target rule."""

import pytest
import torch

from amdahl.protocol.identity import target_label
from amdahl.spec.schema import TargetSpec, TrainSpec
from amdahl.worker.training import LRSchedule, target_reached

BASE = TrainSpec(lr=0.1, lr_scaling="linear", lr_base_batch=256, lr_warmup_steps=4)


def test_linear_scaling_multiplies_by_effective_batch_over_base_batch():
    assert LRSchedule.for_trial(BASE, effective_batch=1024).peak == pytest.approx(0.4)
    assert LRSchedule.for_trial(BASE, effective_batch=128).peak == pytest.approx(0.05)
    unscaled = LRSchedule.for_trial(
        BASE.model_copy(update={"lr_scaling": "none"}), effective_batch=1024
    )
    assert unscaled.peak == pytest.approx(0.1)


def test_warmup_ramps_linearly_from_the_base_rate_to_the_peak():
    schedule = LRSchedule.for_trial(BASE, effective_batch=1024)
    rates = [schedule.at(step) for step in range(6)]
    assert rates == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])


def test_update_sets_every_param_group_and_ends_at_the_peak():
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 9.0}], lr=1.0)
    schedule = LRSchedule(base=0.1, peak=0.4, warmup_steps=4)
    schedule.update(optimizer, 2)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.25, 0.25])
    for step in range(3, 10):  # as the training loop calls it
        schedule.update(optimizer, step)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.4, 0.4])
    no_ramp = torch.optim.SGD([a], lr=1.0)
    LRSchedule(base=0.1, peak=0.4, warmup_steps=0).update(no_ramp, 0)
    assert no_ramp.param_groups[0]["lr"] == pytest.approx(0.4)  # scaled from the first step


def test_target_directions():
    accuracy = TargetSpec(metric="val_accuracy", value=0.9, max_steps=10)
    loss = TargetSpec(metric="val_loss", value=0.5, max_steps=10)
    assert target_reached((1.0, 0.9), accuracy) and not target_reached((1.0, 0.89), accuracy)
    assert target_reached((0.5, None), loss) and not target_reached((0.51, 0.99), loss)
    with pytest.raises(ValueError, match="no accuracy"):
        target_reached((0.1, None), accuracy)
    assert target_label(accuracy) == "val_accuracy>=0.9"
    assert target_label(loss) == "val_loss<=0.5"
    assert target_label(None) is None
