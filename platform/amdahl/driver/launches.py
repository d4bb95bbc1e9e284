"""Measuring a set of trials: Ray Tune schedules the launches, each one Ray Train TorchTrainer.

A launch is one worker group that runs several trials one after another (see plan.Launch), which
is what keeps orchestration cheap. `Measurement.measure` runs a set of trials (all of a grid
sweep, or one rung of a search: `rung_spec`) as launches under one Tuner, and launches again the
trials a crashed launch had not reached. What every launch reads is put in Ray's object store
once by the driver and shared (`_materialise_datasets`); `_launch_trainable` fits one launch's
TorchTrainer; `launch_config` is the workers' contract for one launch (worker.contract), built
from the typed spec and the planned launch. Rows come back through results_sink.ResultSink and
are recorded by `Measurement.record`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from amdahl.driver.results_sink import EventHandler, ResultSink
from amdahl.driver.signals import InterruptFlag
from amdahl.plan.launches import Launch, SweepPlan
from amdahl.plan.resources import DRIVER_CPUS
from amdahl.search.halving import ranks_only, rung_repeats, rung_steps
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.driver_files import ray_storage
from amdahl.sweepdir.table import append_rows
from amdahl.worker.contract import LaunchConfig, TrialConfig, WorkerResources
from amdahl.workload import make_workload

if TYPE_CHECKING:
    from amdahl.track.tracker import Tracker

#: How often Ray Train's controller collects the rows workers report (seconds).
_POLL_INTERVAL_S = 0.25

# --------------------------------------------------------------------------- measuring


@dataclass
class Measurement:
    """What measuring a set of trials needs (a grid sweep measures all of them once; a search
    measures subsets, each rung with its own step count)."""

    spec: SweepSpec
    plan: SweepPlan
    sweep_dir: Path
    #: The rows recorded this session, in order (the list run_sweep returns: `record` appends).
    rows: list[dict[str, Any]]
    tracker: Tracker
    emit: EventHandler
    interrupt: InterruptFlag
    group: bool
    across_devices: bool

    def record(self, row: dict[str, Any]) -> None:
        """A row is final: into results.parquet first (the source of truth), then MLflow."""
        append_rows(self.sweep_dir, [row])
        self.rows.append(row)
        self.tracker.log_trial_soon(row)
        self.emit("trial_done", {"row": row})

    def measure(
        self, trial_ids: set[str], finished: set[tuple[str, int]], rung: int | None = None
    ) -> None:
        """Run `trial_ids` (every repeat not in `finished`) in launches, launching again the
        trials a crashed launch had not reached. `rung`: a search rung, measured with its
        own `train.steps` (search.rung_steps)."""
        spec = self.spec if rung is None else rung_spec(self.spec, rung)
        ranking_only = ranks_only(self.spec.search, self.spec.train, rung)
        repeats = range(spec.train.repeats)
        todo = {tid for tid in trial_ids if not all((tid, r) in finished for r in repeats)}
        if rung is not None:
            steps = rung_steps(self.spec.search, self.spec.train)
            self.emit(
                "rung",
                {"rung": rung, "rungs": len(steps), "steps": steps[rung], "configurations": todo},
            )
        others = {t.trial_id for t in self.plan.trials} - todo
        launches = self.plan.launches(others, self.group, self.across_devices)
        attempt = 0
        while launches:
            done = finished | {
                (row["trial_id"], row["repeat"]) for row in self.rows if row.get("rung") == rung
            }
            relaunch = _run_launches(spec, launches, self, done, attempt, rung, ranking_only)
            if self.interrupt.is_set() or not relaunch:
                return
            attempt += 1
            skip = {t.trial_id for t in self.plan.runnable} - relaunch
            launches = self.plan.launches(skip, self.group, self.across_devices)


def rung_spec(spec: SweepSpec, rung: int) -> SweepSpec:
    """The spec a search rung runs: `train.steps` (time-to-target: `target.max_steps`) cut to
    the rung's length, and the rung's repeats (search.rung_repeats)."""
    steps = rung_steps(spec.search, spec.train)[rung]
    train = spec.train.model_copy(update={"repeats": rung_repeats(spec.search, spec.train, rung)})
    if train.target is not None:
        target = train.target.model_copy(update={"max_steps": steps})
        train = train.model_copy(update={"target": target})
    else:
        train = train.model_copy(update={"steps": steps})
    return spec.model_copy(update={"train": train})


def _run_launches(
    spec: SweepSpec,
    launches: list[Launch],
    run: Measurement,
    finished: set[tuple[str, int]],
    attempt: int = 0,
    rung: int | None = None,
    ranking_only: bool = False,
) -> set[str]:
    """Run these launches under one Tuner; returns the ids of trials to launch again (those a
    crashed launch had not reached, see `ResultSink.on_trial_error`). `attempt` > 0: such a
    relaunch; `rung`: a search rung (`spec` is then the rung's), `ranking_only` when it only
    ranks (search.ranks_only)."""
    session = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    configs = [
        launch_config(
            spec, launch, run.sweep_dir, finished, session, attempt > 0, rung, ranking_only
        )
        for launch in launches
    ]
    datasets = _materialise_datasets(spec, configs)
    by_launch = {launch.launch_id: launch for launch in launches}
    sink = ResultSink(by_launch, {c.launch_id: c for c in configs}, run.record, run.emit)
    concurrency = 1 if spec.isolation == "exclusive" else len(configs)
    name = "tune" if rung is None else f"tune-rung{rung}"
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(
                _launch_trainable, configs={c.launch_id: c for c in configs}, datasets=datasets
            ),
            {"CPU": DRIVER_CPUS},
        ),
        # Tune's variant generator takes dataclass values apart: it grids over launch ids, and
        # each trainable looks its LaunchConfig up.
        param_space={"launch_id": tune.grid_search([c.launch_id for c in configs])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=concurrency,
            trial_name_creator=_launch_name,
            trial_dirname_creator=_launch_name,
        ),
        run_config=tune.RunConfig(
            name=name if attempt == 0 else f"{name}-relaunch-{attempt}",
            storage_path=ray_storage(spec, run.sweep_dir),
            callbacks=[sink],
            stop=run.interrupt,
            verbose=0,
        ),
    )
    tuner.fit()
    return sink.relaunch


# --------------------------------------------------------------------------- one launch


def _launch_name(trial: Any) -> str:
    return f"launch-{trial.config['launch_id']}"


def _materialise_datasets(spec: SweepSpec, configs: list[LaunchConfig]) -> dict[str, Any]:
    """What every launch's workers read, put in the object store once by the driver (before any
    worker group holds CPUs) and shared by all launches, so workers on any node reach it (see
    `data.put_rows`): per training set a Ray Dataset (`ray_data:<key>`) and, for workloads
    without preprocessing, its equal per-rank shards for each device count
    (`shards:<key>:<devices>`); the rows for torch DataLoaders (`torch_loader:<key>`); and the
    user's validation split (`val:<path>`)."""
    from amdahl.data.prepare import rank_shards, ray_dataset
    from amdahl.data.storage import put_rows

    datasets: dict[str, Any] = {}
    for config in configs:
        key = config.dataset_key
        train = f"{config.input}:{key}"
        if train not in datasets:
            datasets[train] = (
                ray_dataset(config.train_path, spec.resources.cpus_per_data_worker)
                if config.input == "ray_data"
                else put_rows(config.train_path)
            )
        if config.input == "ray_data" and not config.preprocesses:
            for world in config.device_counts:
                if f"shards:{key}:{world}" not in datasets:
                    datasets[f"shards:{key}:{world}"] = rank_shards(datasets[train], world)
        if config.val_path and f"val:{config.val_path}" not in datasets:
            datasets[f"val:{config.val_path}"] = put_rows(config.val_path)
    return datasets


def _launch_trainable(
    config: dict[str, str], configs: dict[str, LaunchConfig], datasets: dict[str, Any]
) -> None:
    """Tune function trainable: fit one TorchTrainer that runs every trial of one launch."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from amdahl.data.prepare import repeat_to_cover, with_preprocessing
    from amdahl.worker.harness import train_launch
    from amdahl.worker.trial import rows_per_launch, rows_per_rank

    # Train's controller polls workers for reported rows at this interval (default 2 s): a
    # worker's next report waits for the last one to be collected, so keep it short.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(_POLL_INTERVAL_S))
    # Ray 2.60 starts a preemption watcher process per worker group, for
    # `ray.train.get_preemption_info`, which the harness never reads: one process fewer to
    # start (measured: the first trial started ~0.6 s sooner on 2 cores).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    launch = configs[config["launch_id"]]
    res = launch.resources
    inputs: dict[str, Any] = {}
    if launch.val_path:
        inputs["val_rows"] = datasets[f"val:{launch.val_path}"]
    train_data = {}
    per_rank = rows_per_rank(launch)
    if launch.input == "torch_loader":
        inputs["train_rows"] = datasets[f"torch_loader:{launch.dataset_key}"]
    elif launch.preprocesses:
        # The shared base rows, then this launch's preprocessing with data_workers tasks.
        train_data["train"] = with_preprocessing(
            datasets[f"ray_data:{launch.dataset_key}"],
            make_workload(launch.workload, launch.trials[0].params),
            launch.data_workers,
            res.cpus_per_data_worker,
            max(t.per_device_batch for t in launch.trials),
            rows_per_launch(launch) * res.workers,  # one pass for the launch (LaunchStream)
        )
    else:
        shards = lambda world: datasets[f"shards:{launch.dataset_key}:{world}"]  # noqa: E731
        inputs["train_shards"] = {
            world: [repeat_to_cover(shard, per_rank) for shard in shards(world)]
            for world in launch.device_counts
        }
    launch = launch.with_inputs(**inputs)
    worker = {"CPU": res.cpus_per_worker}
    if res.gpus_per_worker:
        worker["GPU"] = res.gpus_per_worker
    trainer = TorchTrainer(
        train_launch,
        train_loop_config={"launch": launch},
        torch_config=TorchConfig(timeout_s=launch.collective_timeout_s),
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.workers,
            use_gpu=bool(res.gpus_per_worker),
            resources_per_worker=worker,
            placement_strategy=launch.placement,
        ),
        run_config=ray.train.RunConfig(
            name=launch.run_name,
            storage_path=launch.storage_path,
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=launch.train.max_failures),
            # The harness's checkpoint is only the list of finished trials; keep the last.
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
        ),
        datasets=train_data or None,
    )
    trainer.fit()


def launch_config(
    spec: SweepSpec,
    launch: Launch,
    sweep_dir: Path,
    finished: set[tuple[str, int]],
    session: str,
    relaunch: bool = False,
    rung: int | None = None,
    ranking_only: bool = False,
) -> LaunchConfig:
    """The workers' contract for one launch (worker.contract.LaunchConfig): plain data that
    crosses processes, from the typed spec and the planned launch."""
    from amdahl.data.storage import dataset_path
    from amdahl.worker.worlds import collective_timeout_s

    r = launch.resources
    t = spec.train
    trials = tuple(
        TrialConfig.from_settings(
            trial.trial_id,
            trial.settings,
            t.scaling,
            make_workload(spec.workload, trial.settings["params"]).flops_per_sample(),
        )
        for trial in launch.trials
    )
    workload = make_workload(spec.workload, launch.trials[0].settings["params"])
    return LaunchConfig(
        launch_id=launch.launch_id,
        sweep=spec.name,
        workload=spec.workload,
        trials=trials,
        train=t,
        resources=WorkerResources(
            workers=r.workers,
            cpus_per_worker=r.cpus_per_worker,
            gpus_per_worker=r.gpus_per_worker,
            cpus_per_data_worker=spec.resources.cpus_per_data_worker,
        ),
        device_counts=tuple(launch.device_counts),
        skip=tuple(
            sorted(
                (tr.trial_id, rep)
                for tr in launch.trials
                for rep in range(t.repeats)
                if (tr.trial_id, rep) in finished
            )
        ),
        collective_timeout_s=collective_timeout_s(trials),
        train_path=dataset_path(workload, spec.workload, "train", t.seed),
        val_path=dataset_path(workload, spec.workload, "val", t.seed)
        if workload.source("val")
        else None,
        dataset_key=json.dumps(workload.data_key(), sort_keys=True),
        preprocesses=workload.preprocesses,
        placement=spec.resources.placement.upper(),
        storage_path=ray_storage(spec, sweep_dir, "train"),
        # Unique per driver session: a worker group restarted by train.max_failures resumes
        # from this run's checkpoint, but a resumed sweep must trust results.parquet alone
        # (the old driver may have died between a worker's report and the row's write).
        run_name=f"launch-{launch.launch_id}-{session}",
        relaunch=relaunch,
        rung=rung,
        ranking_only=ranking_only,
    )
