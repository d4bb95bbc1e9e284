"""Every axis really changes the computation, and failures become results, not crashes.

These call the worker-side harness in-process on a real Ray Data iterator (no Train worker
group), in a one-rank gloo process group, so they can look inside the model.
"""

import math

import pytest
import torch
from torch import nn
from trial_runner import MLP_PARAMS, launch_config, trial_config

from amdahl.worker.harness import aggregate_ranks
from amdahl.worker.trial import Placement, build_trial_model, run_trial, run_trial_guarded
from workloads.mlp import MLP

pytestmark = pytest.mark.integration


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


PARAMS = MLP_PARAMS


@pytest.fixture(scope="module")
def shard(mlp_shard):
    return mlp_shard


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


STEPS, WARMUP = 6, 2
LAUNCH = launch_config(steps=STEPS, warmup_steps=WARMUP)
CPU = Placement(torch.device("cpu"), 0, 1)


def _trial(**overrides):
    return trial_config(_settings(), flops_per_sample=1.0, **overrides)


def _run(workload, shard, launch=LAUNCH, **overrides):
    """This rank's stats of one trial of `_settings(**overrides)` on one CPU rank."""
    return run_trial(workload, _trial(**overrides), launch, shard, _val(workload), CPU)


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
    stats = _run(workload, shard, precision=precision)
    training_dtypes = set(workload.seen[: STEPS + WARMUP])
    assert training_dtypes == {dtype}
    assert math.isfinite(stats["final_loss"]) and math.isfinite(stats["val_loss"])


def test_compile_axis_wraps_the_model(shard):
    workload = MLP(**PARAMS)
    device = torch.device("cpu")
    eager, *_ = build_trial_model(workload, _trial(sync="none"), LAUNCH, device)
    scripted, *_ = build_trial_model(
        workload, _trial(compile="torchscript", sync="none"), LAUNCH, device
    )
    compiled, *_ = build_trial_model(workload, _trial(compile="inductor"), LAUNCH, device)
    assert isinstance(eager, nn.Sequential)
    assert isinstance(scripted, torch.jit.ScriptModule)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(compiled._orig_mod, nn.parallel.DistributedDataParallel)
    # Same seed, same weights: the wrappers change how, not what, is computed.
    x = torch.randn(4, 8)
    torch.testing.assert_close(scripted(x), eager(x))


def test_torchscript_run_records_compile_time(shard):
    workload = MLP(**PARAMS)
    stats = _run(workload, shard, compile="torchscript")
    assert stats["compile_s"] > 0
    assert stats["first_step_s"] > 0


def test_compile_failure_is_a_recorded_failure(shard):
    workload = Unscriptable(**PARAMS)
    stats, error, kind = run_trial_guarded(
        workload, _trial(compile="torchscript"), LAUNCH, shard, _val(workload), CPU
    )
    assert stats == {} and kind == "failed"
    assert error.startswith("failed: ")
    assert "torch.jit" in error or "Compilation" in error or "script" in error.lower()


def test_a_non_finite_loss_is_recorded_as_diverged(shard):
    workload = MLP(**PARAMS)
    launch = launch_config(steps=STEPS, warmup_steps=WARMUP, lr=1e12)
    stats = _run(workload, shard, launch)
    row = aggregate_ranks([stats], _trial(), launch)
    assert row["status"] == "diverged"
    assert row["error"] == "non-finite training loss"


def test_exposed_communication_is_estimated_for_ddp_only(shard):
    workload = MLP(**PARAMS)
    ddp = _run(workload, shard)
    alone = _run(workload, shard, sync="none")
    assert ddp["comm_s"] is not None and ddp["comm_s"] >= 0
    assert alone["comm_s"] is None


def test_row_accounts_for_every_rank(shard):
    workload = MLP(**PARAMS)
    stats = _run(workload, shard)
    slow = {
        **stats,
        "window_s": stats["window_s"] * 2,
        "step_time_s": stats["step_time_s"] * 3,
        "data_wait_s": stats["data_wait_s"] + 1.0,
    }
    row = aggregate_ranks([stats, slow], _trial(), LAUNCH)
    # Throughput over all ranks is limited by the slowest rank's window.
    assert row["throughput"] == pytest.approx(32 * 2 * STEPS / slow["window_s"])
    assert row["step_time_s"] == slow["step_time_s"]
    assert row["global_batch"] == 64
    assert row["peak_flops"] > 0
    assert 0 < row["mfu"]
    # Per-phase figures are the median over ranks, and the worst rank's kept beside them.
    assert row["data_wait_s"] == pytest.approx(stats["data_wait_s"] + 0.5)
    assert row["data_wait_max_s"] == pytest.approx(slow["data_wait_s"])


def test_workload_without_accuracy_reports_none(shard):
    class NoAccuracy(MLP):
        def correct(self, output, target):
            return None

    workload = NoAccuracy(**PARAMS)
    stats = _run(workload, shard, sync="none")
    assert stats["val_accuracy"] is None
    assert stats["val_loss"] is not None and math.isfinite(stats["val_loss"])


def _target(value: float, max_steps: int = 12, every: int = 2, metric: str = "val_accuracy"):
    return {"metric": metric, "value": value, "max_steps": max_steps, "eval_every": every}


def test_time_to_target_stops_at_the_first_validation_that_meets_it(shard):
    workload = MLP(**PARAMS)
    launch = launch_config(steps=STEPS, warmup_steps=WARMUP, target=_target(0.0))  # any accuracy
    stats = _run(workload, shard, launch, sync="none")
    # Checked only after the 2 warmup steps, every 2 steps: first at step 4.
    assert stats["steps_to_target"] == WARMUP + 2
    assert stats["measured_steps"] == 2
    assert 0 < stats["time_to_target_s"]
    row = aggregate_ranks([stats], _trial(), launch)
    assert row["steps"] == 2 and row["steps_to_target"] == 4
    assert row["throughput"] == pytest.approx(32 * 2 / stats["window_s"])


def test_time_to_target_missed_runs_max_steps_and_records_none(shard):
    workload = MLP(**PARAMS)
    never = _target(1e-9, metric="val_loss")  # never that low
    stats = _run(workload, shard, launch_config(warmup_steps=WARMUP, target=never), sync="none")
    assert stats["steps_to_target"] is None and stats["time_to_target_s"] is None
    assert stats["measured_steps"] == 12 - WARMUP


def test_linear_lr_scaling_sets_the_optimizer_rate_and_changes_training(shard):
    workload = MLP(**PARAMS)
    scaled = launch_config(steps=STEPS, warmup_steps=WARMUP, lr_scaling="linear", lr_base_batch=8)
    plain = _run(workload, shard, sync="none")
    fast = _run(workload, shard, scaled, sync="none")  # batch 32: 4x the rate
    assert plain["lr"] == LAUNCH.train.lr
    assert fast["lr"] == pytest.approx(4 * LAUNCH.train.lr)
    assert fast["final_loss"] != plain["final_loss"]
