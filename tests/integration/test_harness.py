"""Every axis really changes the computation, and failures become results, not crashes.

These call the worker-side harness in-process on a real Ray Data iterator (no Train worker
group), in a one-rank gloo process group, so they can look inside the model.
"""

import math
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from amdahl.harness import _aggregate, _run_guarded, build_trial_model, run_trial
from amdahl.workload import Workload
from workloads.mlp import MLP


class RecordingMLP(MLP):
    """The MLP with a forward hook that records the dtype each Linear layer computes in."""

    def __init__(self, **params):
        super().__init__(**params)
        self.seen: list[torch.dtype] = []

    def build_model(self) -> nn.Module:
        model = super().build_model()
        model[0].register_forward_hook(lambda m, i, out: self.seen.append(out.dtype))
        return model


class Unscriptable(MLP):
    def build_model(self) -> nn.Module:
        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = nn.Linear(8, 2)

            def forward(self, x, **options):  # **kwargs cannot be scripted
                return self.fc(x)

        return Net()


PARAMS = {"inputs": 8, "hidden": [16], "classes": 2, "train_rows": 512, "val_rows": 64}


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


def _settings(**overrides):
    settings = {
        "devices": 1,
        "batch_size": 32,
        "per_device_batch": 32,
        "precision": "fp32",
        "compile": "eager",
        "data_workers": 1,
        "input": "ray_data",
        "prefetch_batches": 2,
        "sync": "ddp",
        "options": {"compile_mode": "default", "bucket_cap_mb": 25.0},
        "params": PARAMS,
    }
    settings.update(overrides)
    return settings


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


def _val(workload):
    return workload.generate("val", 64, seed=0)


@pytest.mark.parametrize(
    "precision, dtype",
    [
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("fp16", torch.float16),
        ("bf16_weights", torch.bfloat16),
    ],
)
def test_precision_changes_the_dtype_inside_forward(shard, precision, dtype):
    workload = RecordingMLP(**PARAMS)
    stats = run_trial(
        workload,
        _settings(precision=precision),
        CONFIG,
        shard,
        _val(workload),
        torch.device("cpu"),
        rank=0,
        world=1,
    )
    training_dtypes = set(workload.seen[: CONFIG["steps"] + CONFIG["warmup_steps"]])
    assert training_dtypes == {dtype}
    assert math.isfinite(stats["final_loss"]) and math.isfinite(stats["val_loss"])


def test_compile_axis_wraps_the_model(shard):
    workload = MLP(**PARAMS)
    device = torch.device("cpu")
    eager, *_ = build_trial_model(workload, _settings(sync="none"), CONFIG, device)
    scripted, *_ = build_trial_model(
        workload, _settings(compile="torchscript", sync="none"), CONFIG, device
    )
    compiled, *_ = build_trial_model(workload, _settings(compile="inductor"), CONFIG, device)
    assert isinstance(eager, nn.Sequential)
    assert isinstance(scripted, torch.jit.ScriptModule)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(compiled._orig_mod, nn.parallel.DistributedDataParallel)
    # Same seed, same weights: the wrappers change how, not what, is computed.
    x = torch.randn(4, 8)
    torch.testing.assert_close(scripted(x), eager(x))


def test_torchscript_run_records_compile_time(shard):
    workload = MLP(**PARAMS)
    stats = run_trial(
        workload,
        _settings(compile="torchscript"),
        CONFIG,
        shard,
        _val(workload),
        torch.device("cpu"),
        rank=0,
        world=1,
    )
    assert stats["compile_s"] > 0
    assert stats["first_step_s"] > 0


def test_compile_failure_is_a_recorded_failure(shard):
    workload = Unscriptable(**PARAMS)
    stats, error, kind = _run_guarded(
        workload,
        _settings(compile="torchscript"),
        CONFIG,
        shard,
        _val(workload),
        torch.device("cpu"),
        0,
        1,
    )
    assert stats == {} and kind == "failed"
    assert error.startswith("failed: ")
    assert "torch.jit" in error or "Compilation" in error or "script" in error.lower()


def test_a_non_finite_loss_is_recorded_as_diverged(shard):
    workload = MLP(**PARAMS)
    config = {**CONFIG, "lr": 1e12}
    stats = run_trial(
        workload, _settings(), config, shard, _val(workload), torch.device("cpu"), rank=0, world=1
    )
    row = _aggregate([stats], _settings(), config)
    assert row["status"] == "diverged"
    assert row["error"] == "non-finite training loss"


def test_exposed_communication_is_estimated_for_ddp_only(shard):
    workload = MLP(**PARAMS)
    ddp = run_trial(workload, _settings(), CONFIG, shard, _val(workload), torch.device("cpu"), 0, 1)
    alone = run_trial(
        workload, _settings(sync="none"), CONFIG, shard, _val(workload), torch.device("cpu"), 0, 1
    )
    assert ddp["comm_s"] is not None and ddp["comm_s"] >= 0
    assert alone["comm_s"] is None


def test_row_accounts_for_every_rank(shard):
    workload = MLP(**PARAMS)
    stats = run_trial(
        workload, _settings(), CONFIG, shard, _val(workload), torch.device("cpu"), 0, 1
    )
    slow = {**stats, "window_s": stats["window_s"] * 2, "step_time_s": stats["step_time_s"] * 3}
    row = _aggregate([stats, slow], _settings(), CONFIG)
    # Throughput over all ranks is limited by the slowest rank's window.
    assert row["throughput"] == pytest.approx(32 * 2 * CONFIG["steps"] / slow["window_s"])
    assert row["step_time_s"] == slow["step_time_s"]
    assert row["global_batch"] == 64
    assert row["peak_flops"] > 0
    assert 0 < row["mfu"]
    assert isinstance(np.float64(row["data_wait_s"]), np.float64)


def test_workload_without_accuracy_reports_none(shard):
    class NoAccuracy(MLP):
        def correct(self, output, target):
            return None

    workload = NoAccuracy(**PARAMS)
    stats = run_trial(
        workload, _settings(sync="none"), CONFIG, shard, _val(workload), torch.device("cpu"), 0, 1
    )
    assert stats["val_accuracy"] is None
    assert isinstance(workload, Workload)


def _target(value: float, max_steps: int = 12, every: int = 2, metric: str = "val_accuracy"):
    return {"metric": metric, "value": value, "max_steps": max_steps, "eval_every": every}


def test_time_to_target_stops_at_the_first_validation_that_meets_it(shard):
    workload = MLP(**PARAMS)
    config = {**CONFIG, "target": _target(0.0)}  # any accuracy meets 0.0
    stats = run_trial(
        workload, _settings(sync="none"), config, shard, _val(workload), torch.device("cpu"), 0, 1
    )
    # Checked only after the 2 warmup steps, every 2 steps: first at step 4.
    assert stats["steps_to_target"] == CONFIG["warmup_steps"] + 2
    assert stats["measured_steps"] == 2
    assert 0 < stats["time_to_target_s"]
    row = _aggregate([stats], _settings(), config)
    assert row["steps"] == 2 and row["steps_to_target"] == 4
    assert row["throughput"] == pytest.approx(32 * 2 / stats["window_s"])


def test_time_to_target_missed_runs_max_steps_and_records_none(shard):
    workload = MLP(**PARAMS)
    config = {**CONFIG, "target": _target(1e-9, metric="val_loss")}  # never that low
    stats = run_trial(
        workload, _settings(sync="none"), config, shard, _val(workload), torch.device("cpu"), 0, 1
    )
    assert stats["steps_to_target"] is None and stats["time_to_target_s"] is None
    assert stats["measured_steps"] == 12 - CONFIG["warmup_steps"]


def test_linear_lr_scaling_sets_the_optimizer_rate_and_changes_training(shard):
    workload = MLP(**PARAMS)
    scaled = {**CONFIG, "lr_scaling": "linear", "lr_base_batch": 8}  # batch 32: 4x the rate
    device = torch.device("cpu")
    plain = run_trial(workload, _settings(sync="none"), CONFIG, shard, _val(workload), device, 0, 1)
    fast = run_trial(workload, _settings(sync="none"), scaled, shard, _val(workload), device, 0, 1)
    assert plain["lr"] == CONFIG["lr"]
    assert fast["lr"] == pytest.approx(4 * CONFIG["lr"])
    assert fast["final_loss"] != plain["final_loss"]
