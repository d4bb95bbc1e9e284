"""The per-step curves a trial records (the results' `history` column): training loss, step time
and data wait per optimizer step, sampled on the worker to at most `HISTORY_POINTS` evenly
spaced steps with the first and last kept, and in the row as rank 0's.

Like test_harness.py, these call the worker-side harness in-process on a real Ray Data iterator
in a one-rank gloo process group."""

import json
import statistics

import pytest
import torch
from trial_runner import MLP_PARAMS, launch_config, settings, trial_config

from amdahl.columns import COLUMNS, HISTORY_POINTS, history_steps
from amdahl.worker.rows import aggregate_ranks
from amdahl.worker.trial import Placement, TrialRun, run_trial
from workloads.mlp import MLP

pytestmark = pytest.mark.integration

PARAMS = MLP_PARAMS
SETTINGS = dict(
    settings(),
    batch_size=16,
    per_device_batch=16,
    data_workers=1,
    input="ray_data",
    params=PARAMS,
)
STEPS, WARMUP = 6, 2


@pytest.fixture(scope="module")
def shard(mlp_shard):
    return mlp_shard


def _trial(shard, steps=STEPS):
    workload = MLP(**PARAMS)
    val = workload.generate("val", 64, seed=0)
    trial = trial_config(SETTINGS, flops_per_sample=1.0)
    launch = launch_config((trial,), steps=steps, warmup_steps=WARMUP)
    return run_trial(
        TrialRun(workload, trial, launch, shard, val, Placement(torch.device("cpu"), 0, 1))
    )


def test_every_step_is_kept_when_few(shard):
    stats = _trial(shard)
    history = stats["history"]
    total = WARMUP + STEPS
    assert history["step"] == list(range(1, total + 1))  # 1-based, warmup included
    assert len(history["loss"]) == len(history["step_time_s"]) == len(history["data_wait_s"])
    assert all(v > 0 for v in history["loss"])
    assert all(v > 0 for v in history["step_time_s"])
    # the curves are the row's figures per step: its data wait is their mean over the
    # measured steps, its step time their median
    measured = slice(WARMUP, None)
    assert stats["data_wait_s"] == pytest.approx(
        statistics.fmean(history["data_wait_s"][measured]), rel=1e-4, abs=1e-7
    )
    assert stats["step_time_s"] == pytest.approx(
        statistics.median(history["step_time_s"][measured]), rel=1e-4
    )
    # The curves and the row's figures are one measurement: the last steps' loss is final_loss.
    assert stats["final_loss"] == pytest.approx(sum(history["loss"][-5:]) / 5, rel=1e-4)


def test_a_long_trial_is_sampled_down_before_it_leaves_the_worker(shard):
    stats = _trial(shard, steps=3 * HISTORY_POINTS)
    history = stats["history"]
    total = WARMUP + 3 * HISTORY_POINTS
    assert history["step"] == [i + 1 for i in history_steps(total)]
    assert len(history["step"]) == HISTORY_POINTS
    assert history["step"][0] == 1 and history["step"][-1] == total
    assert all(len(history[k]) == HISTORY_POINTS for k in ("loss", "step_time_s", "data_wait_s"))


def test_the_row_carries_rank_0s_curves_as_json(shard):
    stats = _trial(shard)
    other = {**stats, "history": {"step": [1], "loss": [9.0], "step_time_s": [1.0]}}
    row = aggregate_ranks(
        [stats, other], trial_config(SETTINGS, flops_per_sample=1.0), launch_config()
    )
    assert "history" in COLUMNS
    assert json.loads(row["history"]) == stats["history"]
    assert " " not in row["history"]  # compact: it travels in every row
