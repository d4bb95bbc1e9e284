"""Run one trial of the worker-side harness in this process, without Ray: the input is a
torch_loader over an in-memory table, the process group (when a strategy needs one) a one-rank
group on loopback. Shared by the CPU attribution tests and the GPU suite."""

from __future__ import annotations

import socket
import time
from typing import Any

import pyarrow as pa
import torch
import torch.distributed as dist
from torch import nn

from amdahl.columns import TrialSettings
from amdahl.data.storage import arrow_column
from amdahl.protocol.contract import LaunchConfig, TrialConfig, WorkerResources
from amdahl.spec.schema import TrainSpec
from amdahl.worker.input import LoaderSource, validation_rows
from amdahl.worker.trial import KeptTrial, Placement, TrialRun, run_trial, run_trial_guarded
from workloads.mlp import MLP

PARAMS = {"inputs": 64, "hidden": [64], "classes": 4, "train_rows": 2048, "val_rows": 128}
#: A smaller MLP, for the in-process tests on a Ray Data shard (tests/integration/conftest.py).
MLP_PARAMS = {"inputs": 8, "hidden": [16], "classes": 2, "train_rows": 512, "val_rows": 64}

#: The train section every in-process trial uses unless a test overrides a field.
TRAIN = {"seed": 0, "lr": 0.05, "optimizer": "sgd", "steps": 8, "warmup_steps": 2}


def settings(**overrides: Any) -> dict[str, Any]:
    s = {
        "devices": 1,
        "batch_size": 32,
        "per_device_batch": 32,
        "precision": "fp32",
        "compile": "eager",
        "data_workers": 0,
        "input": "torch_loader",
        "prefetch_batches": 2,
        "sync": "none",
        "accumulate_steps": 1,
        "options": {
            "compile_mode": "default",
            "bucket_cap_mb": 25.0,
            "powersgd_rank": 1,
            "accumulate_steps": 2,
            "local_sgd_every": 2,
            "ps_shards": 1,
        },
        "params": PARAMS,
    }
    s.update(overrides)
    return s


def trial_config(base: dict[str, Any] | None = None, **overrides: Any) -> TrialConfig:
    """A TrialConfig from `settings()` (or `base`) with `overrides`: the axes, `params` and
    `options` go into its TrialSettings, the rest (`per_device_batch`, `flops_per_sample`,
    ...) into the TrialConfig."""
    s = {"trial_id": "trial", "axis_params": {}, **(base or settings()), **overrides}
    held = {k: s[k] for k in TrialSettings.__dataclass_fields__ if k in s}
    derived = {k: s[k] for k in TrialConfig.__dataclass_fields__ if k in s and k != "settings"}
    return TrialConfig(settings=TrialSettings(**held), **derived)


def launch_config(trials: tuple[TrialConfig, ...] = (), **train: Any) -> LaunchConfig:
    """A one-rank LaunchConfig whose train section is TRAIN with `train` overrides."""
    return LaunchConfig(
        launch_id="launch",
        sweep="test",
        workload="mlp",
        trials=trials,
        train=TrainSpec(**{**TRAIN, **train}),
        resources=WorkerResources(1, 1.0, 0.0, 1.0),
        device_counts=(1,),
        collective_timeout_s=600,
        train_path="",
        val_path=None,
        dataset_key="",
        preprocesses=False,
        placement="PACK",
        storage_path="",
        run_name="",
    )


def one_rank_group(backend: str) -> None:
    """A one-rank default process group on loopback (idempotent)."""
    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def loader_source(workload: MLP) -> LoaderSource:
    """The workload's generated training rows through a DataLoader in this process."""
    rows = workload.generate("train", workload.params["train_rows"], seed=0)
    table = pa.table({k: arrow_column(v) for k, v in rows.items()})
    return LoaderSource(table, workload, rank=0, world=1, workers=0)


def continued_and_whole(
    workload: MLP, trial: TrialConfig, other: TrialConfig, where: Placement
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], KeptTrial]:
    """(whole, first, second, kept): `trial` for 30 steps in one run, and for 10 steps kept
    then continued to 30 with `other` run between (as a halving rung runs them). Three warmup
    steps, as a sweep has (10 by default): the memory ledger then counts the last of them, a
    step the trial runs anyway (worker/tensor_ledger.py), not one more after the window."""
    val = validation_rows(workload, None, seed=0)
    launch = lambda t, steps=8: launch_config((t,), steps=steps, warmup_steps=3)  # noqa: E731
    whole = run_trial(
        TrialRun(workload, trial, launch(trial, 30), loader_source(workload), val, where)
    )
    kept: list[KeptTrial] = []
    source = loader_source(workload)
    first = run_trial(TrialRun(workload, trial, launch(trial, 10), source, val, where, keep=kept))
    run_trial(TrialRun(workload, other, launch(other), loader_source(workload), val, where))
    second = run_trial(
        TrialRun(workload, trial, launch(trial, 30), source, val, where, resume=kept[0])
    )
    return whole, first, second, kept[0]


def run(
    workload: MLP, device: torch.device, launch: LaunchConfig | None = None, **overrides: Any
) -> tuple[dict[str, Any], str | None, str | None]:
    """(stats, error, failure kind) of one trial, as `run_trial_guarded` returns them."""
    source = loader_source(workload)
    val = validation_rows(workload, None, seed=0)
    trial = trial_config(**overrides)
    return run_trial_guarded(
        TrialRun(
            workload, trial, launch or launch_config((trial,)), source, val, Placement(device, 0, 1)
        )
    )


class _SleepyForward(nn.Module):
    def __init__(self, inner: nn.Module, seconds: float):
        super().__init__()
        self.inner, self.seconds = inner, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # Keep the GPU itself busy for `seconds`: a host sleep would only delay the launch.
            torch.cuda._sleep(int(self.seconds * _cycles_per_second()))
        else:
            time.sleep(self.seconds)
        return self.inner(x)


def _cycles_per_second() -> float:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate * 1e3


class SlowForward(MLP):
    """Every forward takes FORWARD_S longer, on the device that runs it."""

    #: Long beside a tiny MLP's own step (well under a millisecond), so that a loaded machine's
    #: scheduling delays cannot blur which column the time lands in.
    FORWARD_S = 0.1

    def build_model(self) -> nn.Module:
        return _SleepyForward(super().build_model(), self.FORWARD_S)


class SlowData(MLP):
    """Every batch takes DATA_S longer to preprocess (host work, in the input pipeline)."""

    DATA_S = 0.1

    def preprocess(self, batch: dict, training: bool) -> dict:
        if training:
            time.sleep(self.DATA_S)
        return batch
