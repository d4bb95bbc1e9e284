"""Activation checkpointing (issue 48): it must trade memory for FLOPs in a trial as it runs,
or the axis is ignored. A trial of the built-in GPT with each mode, through the harness: the
measured activation bytes fall and the counted hardware FLOPs rise with the blocks
checkpointed, while the model's FLOPs (MFU's numerator) stay the plain model's."""

from __future__ import annotations

import pytest
import torch
from trial_runner import launch_config, run

from amdahl.worker.checkpointing import apply_checkpointing, checkpointed_blocks
from workloads.gpt import GPT
from workloads.mlp import MLP

GPT_PARAMS = {"width": 64, "layers": 4, "heads": 4, "context": 32, "train_rows": 256}


@pytest.fixture(scope="module")
def by_mode() -> dict[str, dict]:
    out = {}
    for mode in ("none", "selective", "full"):
        stats, error, _ = run(
            GPT(**GPT_PARAMS),
            torch.device("cpu"),
            activation_checkpointing=mode,
            params=GPT_PARAMS,
            launch=launch_config(warmup_steps=3),
        )
        assert error is None, error
        out[mode] = stats
    return out


def test_checkpointing_lowers_the_activations_a_trial_holds(by_mode):
    held = {m: s["mem_activations_bytes"] for m, s in by_mode.items()}
    assert held["full"] < held["selective"] < held["none"], held
    # parameters are the model's whatever the mode
    assert len({s["mem_parameters_bytes"] for s in by_mode.values()}) == 1


def test_checkpointing_adds_the_recomputed_forward_to_hardware_flops_only(by_mode):
    counted = {m: s["flops_counted"] for m, s in by_mode.items()}
    assert len({c.model for c in counted.values()}) == 1, counted
    hardware = {m: c.hardware for m, c in counted.items()}
    assert hardware["none"] < hardware["selective"] < hardware["full"], hardware
    # the recomputation is at most one more forward of the blocks: under a third of a step
    assert hardware["full"] < 1.34 * hardware["none"]


def test_full_wraps_every_named_block_and_selective_every_other():
    workload = GPT(**GPT_PARAMS)
    for mode, expected in (("none", 0), ("selective", 2), ("full", 4)):
        model = apply_checkpointing(workload, workload.build_model(), mode)
        wrapped = [m for m in model.modules() if type(m).__name__ == "CheckpointWrapper"]
        assert len(wrapped) == expected, mode


def test_a_workload_that_names_no_blocks_is_told_how_to():
    workload = MLP()
    assert not workload.names_blocks() and GPT().names_blocks()
    with pytest.raises(ValueError, match=r"MLP.blocks\(model\) names no blocks"):
        checkpointed_blocks(workload, workload.build_model(), "full")
