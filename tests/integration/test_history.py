"""The per-step curves a trial records (the results' `history` column): training loss, step time
and data wait per optimizer step, sampled on the worker to at most `HISTORY_POINTS` evenly
spaced steps with the first and last kept, and in the row as rank 0's.

Like test_harness.py, these call the worker-side harness in-process on a real Ray Data iterator
in a one-rank gloo process group."""

import json
import socket

import pytest
import torch
import torch.distributed as dist

from amdahl.harness import _aggregate, run_trial
from amdahl.results import COLUMNS, HISTORY_POINTS, history_steps
from workloads.mlp import MLP

PARAMS = {"inputs": 8, "hidden": [16], "classes": 2, "train_rows": 512, "val_rows": 64}
SETTINGS = {
    "devices": 1,
    "batch_size": 16,
    "per_device_batch": 16,
    "precision": "fp32",
    "compile": "eager",
    "data_workers": 1,
    "input": "ray_data",
    "prefetch_batches": 2,
    "sync": "none",
    "options": {"compile_mode": "default", "bucket_cap_mb": 25.0},
    "params": PARAMS,
}
CONFIG = {
    "seed": 0,
    "lr": 0.05,
    "optimizer": "sgd",
    "steps": 6,
    "warmup_steps": 2,
    "flops_per_sample": 1.0,
    "lr_scaling": "none",
    "lr_base_batch": 256,
    "lr_warmup_steps": 0,
    "target": None,
}


@pytest.fixture(scope="module")
def process_group():
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def shard(ray_cluster, process_group):
    import ray.data

    columns = MLP(**PARAMS).generate("train", 512, seed=0)
    return (
        ray.data.from_items(
            [{"x": x, "y": y} for x, y in zip(columns["x"], columns["y"], strict=True)]
        )
        .materialize()
        .iterator()
    )


def _trial(shard, config):
    workload = MLP(**PARAMS)
    val = workload.generate("val", 64, seed=0)
    return run_trial(workload, SETTINGS, config, shard, val, torch.device("cpu"), 0, 1)


def test_every_step_is_kept_when_few(shard):
    stats = _trial(shard, CONFIG)
    history = stats["history"]
    total = CONFIG["warmup_steps"] + CONFIG["steps"]
    assert history["step"] == list(range(1, total + 1))  # 1-based, warmup included
    assert len(history["loss"]) == len(history["step_time_s"]) == len(history["data_wait_s"])
    assert all(v > 0 for v in history["loss"])
    assert all(v > 0 for v in history["step_time_s"])
    assert all(v >= 0 for v in history["data_wait_s"])
    # The curves and the row's figures are one measurement: the last steps' loss is final_loss.
    assert stats["final_loss"] == pytest.approx(sum(history["loss"][-5:]) / 5, rel=1e-4)


def test_a_long_trial_is_sampled_down_before_it_leaves_the_worker(shard):
    config = {**CONFIG, "steps": 3 * HISTORY_POINTS}
    stats = _trial(shard, config)
    history = stats["history"]
    total = config["warmup_steps"] + config["steps"]
    assert history["step"] == [i + 1 for i in history_steps(total)]
    assert len(history["step"]) == HISTORY_POINTS
    assert history["step"][0] == 1 and history["step"][-1] == total
    assert all(len(history[k]) == HISTORY_POINTS for k in ("loss", "step_time_s", "data_wait_s"))


def test_the_row_carries_rank_0s_curves_as_json(shard):
    stats = _trial(shard, CONFIG)
    other = {**stats, "history": {"step": [1], "loss": [9.0], "step_time_s": [1.0]}}
    row = _aggregate([stats, other], SETTINGS, CONFIG)
    assert "history" in COLUMNS
    assert json.loads(row["history"]) == stats["history"]
    assert " " not in row["history"]  # compact: it travels in every row
