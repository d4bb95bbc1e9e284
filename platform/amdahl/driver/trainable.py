"""What one launch runs: its contract (`launch_config`), the data its workers read, put in
Ray's object store once by the driver (`materialise_datasets`), and the Tune function trainable
that fits its TorchTrainer (`launch_trainable`), whose workers run worker/harness.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from amdahl.plan.launches import Launch
from amdahl.plan.trials import Trial
from amdahl.protocol.contract import (
    LaunchConfig,
    TrialConfig,
    WorkerResources,
    collective_timeout_s,
)
from amdahl.protocol.sizing import rows_per_launch, rows_per_rank
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.driver_files import ray_storage
from amdahl.workload.code import make_workload

#: How often Ray Train's controller polls its workers (seconds).
_POLL_INTERVAL_S = 0.25


def materialise_datasets(
    spec: SweepSpec, configs: list[LaunchConfig], have: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What every launch's workers read, put in the object store once by the driver (before any
    worker group holds CPUs) and shared by all launches, so workers on any node reach it (see
    `data.put_rows`): per training set a Ray Dataset (`ray_data:<key>`) and, for workloads
    without preprocessing, its equal per-rank shards for each device count
    (`shards:<key>:<devices>`); the rows for torch DataLoaders (`torch_loader:<key>`); and the
    user's validation split (`val:<path>`). `have`: what earlier launches of the sweep already
    put there (reused)."""
    from amdahl.data.prepare import rank_shards, ray_dataset
    from amdahl.data.storage import put_rows

    datasets: dict[str, Any] = dict(have or {})
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


def launch_trainable(
    config: dict[str, str], configs: dict[str, LaunchConfig], datasets: dict[str, Any]
) -> None:
    """Tune function trainable: fit one TorchTrainer whose workers run what the driver's
    queue hands this launch (worker.harness.train_launch)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from amdahl.data.prepare import repeat_to_cover, with_preprocessing
    from amdahl.worker.harness import train_launch

    # Train's controller polls its workers at this interval (default 2 s): how soon a dead
    # worker is noticed and the group restarted.
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
            make_workload(launch.workload, launch.trials[0].settings.params),
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
            failure_config=ray.train.FailureConfig(max_failures=launch.train.max_failures),
        ),
        datasets=train_data or None,
    )
    trainer.fit()


def launch_config(
    spec: SweepSpec,
    launch: Launch,
    sweep_dir: Path,
    session: str,
    queue: Any = None,
) -> LaunchConfig:
    """The workers' contract for one launch (protocol.contract.LaunchConfig): plain data that
    crosses processes, from the typed spec and the planned launch; `queue` is the work queue
    actor it leases its items from (driver/pool.py)."""
    from amdahl.data.storage import dataset_path

    r = launch.resources
    t = spec.train
    trials = tuple(_trial_config(spec, trial) for trial in launch.trials)
    workload = make_workload(spec.workload, launch.trials[0].settings.params)
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
        collective_timeout_s=collective_timeout_s(trials),
        train_path=dataset_path(workload, spec.workload, "train", t.seed),
        val_path=dataset_path(workload, spec.workload, "val", t.seed)
        if workload.source("val")
        else None,
        dataset_key=json.dumps(workload.data_key(), sort_keys=True),
        preprocesses=workload.preprocesses,
        placement=spec.resources.placement.upper(),
        storage_path=ray_storage(spec, sweep_dir, "train"),
        # Unique per driver session and round: Train keeps each run's state apart.
        run_name=f"launch-{launch.launch_id}-{session}",
        queue=queue,
    )


def _trial_config(spec: SweepSpec, trial: Trial) -> TrialConfig:
    """One planned trial's contract, with its workload's stated FLOPs per sample and whether
    they override the count the worker makes (worker/flops.py)."""
    workload = make_workload(spec.workload, trial.settings.params)
    config = TrialConfig.from_settings(
        trial.trial_id,
        trial.settings,
        spec.train.scaling,
        workload.flops_per_sample(),
        flops_override=workload.flops_override,
    )
    return dataclasses.replace(config, predicted_peak_mem_bytes=trial.predicted_peak_mem_bytes)
