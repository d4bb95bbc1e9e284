"""Every axis really changes the computation, and failures become results, not crashes.

These call the worker-side harness in-process on a real Ray Data iterator (no Train worker
group), in a one-rank gloo process group, so they can look inside the model.
"""

import math
import os
import socket
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from trial_runner import MLP_PARAMS, launch_config, settings, trial_config

from amdahl.data.storage import arrow_column
from amdahl.worker.input import LoaderSource
from amdahl.worker.rows import aggregate_ranks
from amdahl.worker.trial import Placement, TrialRun, build_trial_model, run_trial, run_trial_guarded
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
    return run_trial(TrialRun(workload, _trial(**overrides), launch, shard, _val(workload), CPU))


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


class SlowFirstLoss(MLP):
    """The first loss of a trial takes FIRST_S longer: a first step with a known excess."""

    FIRST_S = 1.0  # long beside a tiny MLP step, even on a machine this busy

    def __init__(self, **params):
        super().__init__(**params)
        self.losses = 0

    def loss(self, output, target):
        self.losses += 1
        if self.losses == 1:
            time.sleep(self.FIRST_S)
        return super().loss(output, target)


def test_compile_s_is_the_wrapping_plus_the_first_steps_excess(shard, monkeypatch):
    """Known costs: scripting (slowed by 0.3 s and timed by the test around the call) and a
    first step FIRST_S slower than the rest. A TorchScript trial books both as compile_s, within
    what its host clock saw (set-up plus first step); an eager trial with the same slow first
    step compiles nothing, so its compile_s stays 0 and the excess is only in first_step_s."""
    script_s, script = 0.3, torch.jit.script

    scripting: list[float] = []  # this test's own stopwatch around the scripting

    def slow_script(obj, *args, _frames_up=0, **kwargs):
        if not isinstance(obj, nn.Module):  # torch scripts helpers of its own: not timed
            return script(obj, *args, _frames_up=_frames_up + 1, **kwargs)
        start = time.perf_counter()
        time.sleep(script_s)
        scripted = script(obj, *args, _frames_up=_frames_up + 1, **kwargs)
        scripting.append(time.perf_counter() - start)
        return scripted

    monkeypatch.setattr(torch.jit, "script", slow_script)
    # A process's first optimizer imports torch._dynamo (seconds on a busy machine), and
    # build_trial_model's wrap_s counts it: import it first, so only the known costs remain.
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    scripted = _run(SlowFirstLoss(**PARAMS), shard, compile="torchscript", sync="none")
    eager = _run(SlowFirstLoss(**PARAMS), shard, sync="none")
    first_s = SlowFirstLoss.FIRST_S
    assert len(scripting) == 1 and scripting[0] >= script_s
    # both parts: the scripting as timed here, and (nearly all of) the first step's sleep
    assert scripting[0] + 0.9 * first_s <= scripted["compile_s"], (scripting, scripted)
    assert scripted["compile_s"] <= scripted["setup_s"] + scripted["first_step_s"], scripted
    assert scripted["step_time_s"] < first_s  # no measured step carries it
    assert eager["compile_s"] == 0.0
    assert eager["first_step_s"] >= first_s > eager["step_time_s"]


def test_compile_failure_is_a_recorded_failure(shard):
    workload = Unscriptable(**PARAMS)
    stats, error, kind = run_trial_guarded(
        TrialRun(workload, _trial(compile="torchscript"), LAUNCH, shard, _val(workload), CPU)
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


#: An MLP whose gradient (8.4 MB, almost all of it the first layer's, which backward reaches
#: last) is slow to all-reduce beside its compute: DDP has nothing left to hide it behind.
WIDE = {"inputs": 1024, "hidden": [2048], "classes": 4, "train_rows": 1024, "val_rows": 64}


def _two_rank_trials(rank: int, port: int, out_dir: Path) -> None:
    """One rank of a two-process gloo group: a ddp and a none trial of WIDE through the
    harness, then the gradient's all-reduce timed on its own (`spawn` target)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        workload = MLP(**WIDE)
        rows = workload.generate("train", WIDE["train_rows"], seed=0)
        table = pa.table({k: arrow_column(v) for k, v in rows.items()})
        source = LoaderSource(table, workload, rank=rank, world=2, workers=0)
        where = Placement(torch.device("cpu"), rank, 2)
        out = {}
        for sync in ("ddp", "none"):
            s = settings(params=WIDE, devices=2, batch_size=16, per_device_batch=8, sync=sync)
            out[sync] = run_trial(
                TrialRun(workload, trial_config(s), LAUNCH, source, _val(workload), where)
            )
        gradient = torch.zeros(sum(p.numel() for p in workload.build_model().parameters()))
        times = []
        for _ in range(7):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(gradient)
            times.append(time.perf_counter() - start)
        out["all_reduce_s"] = min(times)  # its floor: what backward cannot hide, at best
        torch.save(out, out_dir / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # past gloo's occasional abort at exit (see tests/unit/worker/test_sync.py)


def test_exposed_communication_is_the_all_reduce_backward_cannot_hide(tmp_path):
    """Two gloo ranks: the ddp trial's comm_s is at least most of the gradient's all-reduce
    timed on its own (the harness clips at 0, so a broken estimate reads 0: synced and no_sync
    passes swapped, or no_sync not applied), and in seconds; a trial without communication has
    none. No tighter upper bound: on a busy machine the synced passes also wait for the other
    rank, whatever it was descheduled for."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_rank_trials, args=(port, tmp_path), nprocs=2, join=True)
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=False)
    ddp, none, all_reduce_s = rank0["ddp"], rank0["none"], rank0["all_reduce_s"]
    assert none["comm_s"] is None
    assert 0.3 * all_reduce_s <= ddp["comm_s"] < 1.0, (all_reduce_s, ddp)


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
