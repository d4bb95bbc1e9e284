"""The driver -> worker contract: everything a launch's workers need, as frozen dataclasses,
and the process-group timeout a launch's trials need.

The driver (driver/trainable.py, `launch_config`) builds one `LaunchConfig` per launch from the
typed spec and the plan; it crosses process boundaries by pickle (Tune's param space, Ray
Train's `train_loop_config`), and the worker side (harness, trial, input, training, worlds)
reads only its fields. Pure: no Ray, no torch (docs/architecture.md, "The launch contract").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from amdahl import columns, strategies
from amdahl.columns import TrialSettings
from amdahl.protocol.items import WorkItem
from amdahl.spec.schema import TargetSpec, TrainSpec

#: Process-group timeout (seconds) for a launch's groups (Ray Train's TorchConfig and the ones
#: worker/worlds.py rebuilds), by the slowest compilation its trials may run before their first
#: collective: a rank compiling longer than this leaves its peers' collective to time out, and
#: then NCCL's error handling aborts the process. max-autotune benchmarks many kernels per graph
#: (tens of minutes for a large model is not unusual).
COLLECTIVE_TIMEOUT_S = {"eager": 600, "torchscript": 600, "inductor": 1800, "max-autotune": 3600}


@dataclass(frozen=True)
class TrialConfig:
    """One trial of a launch: its id, its settings as planned (one value per axis, the
    workload's params, the options its axis values read: plan.trials.Trial.settings) and what
    the driver derives for the workers. A new axis is a field of TrialSettings, read as
    `trial.settings.<axis>`; nothing of it is declared again here.

    The settings' dicts are read-only by convention (plain dicts, so that they pickle)."""

    trial_id: str
    settings: TrialSettings
    #: What one rank's forward pass takes: `settings.batch_size`, the global batch under strong
    #: scaling (split over the devices) or per device under weak.
    per_device_batch: int
    #: The workload's stated figure for these params (Workload.flops_per_sample): a cross-check
    #: of the count the worker makes (worker/flops.py), the figure MFU uses if `flops_override`.
    flops_per_sample: float | None = None
    flops_override: bool = False
    #: Its peak tensor bytes per rank as the plan predicted them (plan.fits), for its row.
    predicted_peak_mem_bytes: float | None = None

    @classmethod
    def from_settings(
        cls,
        trial_id: str,
        settings: TrialSettings,
        scaling: str,
        flops_per_sample: float | None = None,
        flops_override: bool = False,
    ) -> TrialConfig:
        """From a planned trial's settings (plan.Trial.settings) and the spec's scaling."""
        batch = columns.per_device_batch(settings.batch_size, settings.devices, scaling)
        return cls(trial_id, settings, int(batch), flops_per_sample, flops_override)

    @property
    def inductor(self) -> bool:
        return self.settings.compile == "inductor"

    @property
    def micro_steps(self) -> int:
        """Forward/backward passes per optimizer step (strategies.micro_steps)."""
        s = self.settings
        return strategies.micro_steps(s.sync, s.options, s.accumulate_steps)

    @property
    def compile_cache(self) -> str | None:
        """cold or warm for an inductor trial, None otherwise (nothing is compiled)."""
        return self.settings.options.get("compile_cache", "cold") if self.inductor else None


@dataclass(frozen=True)
class WorkerResources:
    """What each of the launch's Ray Train workers holds."""

    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    cpus_per_data_worker: float

    @property
    def torch_threads(self) -> int:
        return max(1, int(self.cpus_per_worker))


@dataclass(frozen=True)
class LaunchConfig:
    """One launch: a worker group running `trials` (plan.Launch), one work item at a time."""

    launch_id: str
    sweep: str
    workload: str
    trials: tuple[TrialConfig, ...]
    #: The spec's train section (steps, warmup, repeats, seed, learning rate, target, ...).
    train: TrainSpec
    resources: WorkerResources
    #: Device counts of the launch's trials (one worker group can serve several).
    device_counts: tuple[int, ...]
    collective_timeout_s: int
    #: Where the stored training and validation rows are (data.storage.dataset_path).
    train_path: str
    val_path: str | None
    #: JSON of the workload's data_key: launches with equal keys read the same rows.
    dataset_key: str
    preprocesses: bool
    #: Ray Train's placement strategy (PACK or SPREAD), its storage and its run name.
    placement: str
    storage_path: str
    run_name: str
    #: The driver's work queue (a Ray actor handle, driver/work_queue.py) this launch leases
    #: its items from; None where a launch is run by hand (tests run one trial directly).
    queue: Any = None
    #: search: halving: the rung this item measures (`train.steps` is the rung's), else None.
    rung: int | None = None
    #: A search rung before the last (search.ranks_only): trials measure their window and skip
    #: the validation pass and the exposed-communication calibration (val_*, comm_s stay null).
    ranking_only: bool = False
    #: Object refs the driver's trainable fills in (data.storage.put_rows,
    #: data.prepare.rank_shards): the user's validation rows, torch_loader's rows, and per
    #: device count each rank's shard.
    val_rows: Any = None
    train_rows: Any = None
    train_shards: dict[int, list[Any]] | None = None

    @property
    def input(self) -> str:
        """ray_data or torch_loader: one per launch (it is part of the launch key)."""
        return self.trials[0].settings.input

    @property
    def data_workers(self) -> int:
        return self.trials[0].settings.data_workers

    @property
    def target(self) -> TargetSpec | None:
        return self.train.target

    @property
    def steps_per_trial(self) -> int:
        """Optimizer steps a trial runs, warmup included (time-to-target: at most)."""
        t = self.train
        return t.target.max_steps if t.target else t.warmup_steps + t.steps

    def for_item(self, item: WorkItem) -> LaunchConfig:
        """The launch as one work item runs it: its rung, the rung's length, ranking only."""
        train = self.train
        if item.steps is not None and train.target is not None:
            target = train.target.model_copy(update={"max_steps": item.steps})
            train = train.model_copy(update={"target": target})
        elif item.steps is not None:
            train = train.model_copy(update={"steps": item.steps})
        return dataclasses.replace(
            self, train=train, rung=item.rung, ranking_only=item.ranking_only
        )

    def with_inputs(self, **inputs: Any) -> LaunchConfig:
        """A copy carrying the driver's object refs (`val_rows`, `train_rows`, `train_shards`)."""
        return dataclasses.replace(self, **inputs)


def collective_timeout_s(trials: Iterable[TrialConfig]) -> int:
    """The longest collective timeout any of a launch's trials needs."""
    longest = COLLECTIVE_TIMEOUT_S["eager"]
    for trial in trials:
        kind = trial.settings.compile
        if kind == "inductor" and str(trial.settings.options.get("compile_mode")).startswith(
            "max-autotune"
        ):
            kind = "max-autotune"
        longest = max(longest, COLLECTIVE_TIMEOUT_S[kind])
    return longest
