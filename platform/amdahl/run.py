"""Driver side: plan, then let Ray Tune schedule launches, each fitting one Ray Train TorchTrainer.

A launch is one worker group that runs several trials one after another (see plan.Launch), which
is what keeps orchestration cheap. Results stream back through Tune: the harness reports one row
per trial repeat, `TuneReportCallback` forwards it to the launch's Tune trial, and `_ResultSink`
(a Tune callback running here, in the driver) appends it to results.parquet and mirrors it to
MLflow. The driver is the only writer of both.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from ray import tune

from amdahl.errors import UserError
from amdahl.files import private_dir, touch_private, write_private
from amdahl.plan import DRIVER_CPUS, Launch, Node, SweepPlan, Trial, check_storage, plan_sweep
from amdahl.results import (
    RESULTS_FILE,
    ROW_KEY,
    SETTING_COLUMNS,
    append_rows,
    failure_status,
    read_results,
)
from amdahl.spec import SweepSpec
from amdahl.workload import locate_spec_workload, make_workload

#: Events the runner emits for whoever renders progress: (kind, payload).
EventHandler = Callable[[str, dict[str, Any]], None]

SPEC_FILE = "spec.yaml"
_POLL_INTERVAL_S = 0.25
PLAN_FILE = "plan.json"


@dataclass
class SweepOutcome:
    sweep_dir: Path
    plan: SweepPlan
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") != "ok"]


# --------------------------------------------------------------------------- planning


def make_plan(spec: SweepSpec, nodes: list[Node] | None = None) -> SweepPlan:
    """Validate the workload and its parameters, then plan against `nodes` (default: this host);
    a plan spanning several nodes without shared `storage` is refused (plan.check_storage).

    The workload is imported from the user's folder where it lives there (workload_path, the
    sweep file's directory, the working directory: workload.locate_workload), must implement
    every abstract method, and its data path runs on a few rows of every parameter set
    (workload.check_workload): all before anything is drawn or launched.
    """
    from amdahl.data import check_source
    from amdahl.workload import check_workload

    locate_spec_workload(spec)
    workload = make_workload(spec.workload, spec.params)
    for name, values in spec.grid.param_axes().items():
        for v in values:
            variant = make_workload(spec.workload, {**spec.params, name: v})
            check_source(variant)
            check_workload(variant, spec.train.seed, "ray_data" in spec.grid.input)
    check_source(workload)
    check_workload(workload, spec.train.seed, "ray_data" in spec.grid.input)
    plan = plan_sweep(
        spec,
        nodes if nodes is not None else local_nodes(),
        workload.defaults,
        preprocesses=workload.preprocesses,
    )
    check_storage(plan)
    return plan


def local_nodes() -> list[Node]:
    """This machine as Ray would see it if started here with defaults."""
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        pass
    return [Node(cpus=float(os.cpu_count() or 1), gpus=float(gpus), name="local")]


def ray_nodes() -> list[Node]:
    """The nodes the connected Ray cluster has, or can have: the alive nodes, or, on an
    autoscaling cluster whose node types add up to more, every node the autoscaler may start
    (`max_workers` of each type; Ray Train waits while it starts them). Without this, a fresh
    cluster with `min_workers: 0` would refuse every GPU trial."""
    import ray

    alive = [
        Node(
            cpus=n["Resources"].get("CPU", 0.0),
            gpus=n["Resources"].get("GPU", 0.0),
            name=n.get("NodeManagerAddress", "node"),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]
    possible = autoscaler_nodes(ray._private.state.state.get_cluster_config())
    capacity = lambda nodes: (sum(n.gpus for n in nodes), sum(n.cpus for n in nodes))  # noqa: E731
    return possible if capacity(possible) > capacity(alive) else alive


#: Nodes planned for a node type whose `max_workers` is unbounded.
UNBOUNDED_NODE_TYPE = 64


def autoscaler_nodes(config: Any) -> list[Node]:
    """Every node an autoscaler's cluster config (Ray's `autoscaler_pb2.ClusterConfig`, as the
    autoscaler publishes it in the GCS; None without an autoscaler) may run at once."""
    if config is None:
        return []
    nodes = []
    for group in config.node_group_configs:
        count = group.max_count if group.max_count >= 0 else UNBOUNDED_NODE_TYPE
        cpus, gpus = float(group.resources.get("CPU", 0)), float(group.resources.get("GPU", 0))
        nodes += [Node(cpus=cpus, gpus=gpus, name=f"{group.name}-{i}") for i in range(count)]
    return nodes


# --------------------------------------------------------------------------- running


class SweepInterrupted(Exception):
    """Ctrl-C (SIGINT) or SIGTERM (`ray job stop`, a batch scheduler) stopped the sweep;
    everything finished so far is saved in `sweep_dir`. `exit_code`: 128 + the signal number."""

    def __init__(self, sweep_dir: Path, signum: int = signal.SIGINT):
        self.sweep_dir, self.signum = sweep_dir, int(signum)
        self.exit_code = 128 + int(signum)
        self.reason = (
            "interrupted"
            if signum == signal.SIGINT
            else f"stopped by {signal.Signals(signum).name}"
        )
        super().__init__(f"{self.reason}; finished trials are saved in {sweep_dir}")


def run_sweep(
    spec: SweepSpec,
    *,
    address: str | None = None,
    runs_dir: str | Path = "runs",
    resume: str | Path | None = None,
    retry_failed: bool = False,
    new_if_changed: bool = False,
    on_event: EventHandler | None = None,
    verbose: bool = False,
    tracking: bool | None = None,
    group_launches: bool = True,
    share_across_devices: bool = True,
) -> SweepOutcome:
    """Plan, launch and record a whole sweep; returns what was run and where it was written.

    Uses the Ray already initialised in this process if any, else connects to `address`, else
    starts a local Ray sized to this machine. With `resume` (a sweep directory), only trial
    repeats without a final row there run (failed ones too with `retry_failed`); a resume whose
    measurement settings differ from the directory's is refused (see `spec_changes`), or with
    `new_if_changed` starts a new directory instead. The sweep directory is locked for the
    whole run (see `lock_sweep_dir`): a second driver there is refused.
    `group_launches=False` starts one worker group per trial, `share_across_devices=False` one
    per device count (both for overhead comparisons).
    Raises SweepInterrupted after a first Ctrl-C or SIGTERM has stopped it cleanly.
    """
    sweep_dir, finished, lock, created = _open_sweep_dir(
        spec, Path(runs_dir), resume, retry_failed, new_if_changed
    )
    try:
        return _run_locked(
            spec,
            sweep_dir,
            finished,
            created,
            address=address,
            on_event=on_event,
            verbose=verbose,
            tracking=tracking,
            group_launches=group_launches,
            share_across_devices=share_across_devices,
        )
    finally:
        lock.release()


def _run_locked(
    spec: SweepSpec,
    sweep_dir: Path,
    finished: set[tuple[str, int]],
    created: bool,
    *,
    address: str | None,
    on_event: EventHandler | None,
    verbose: bool,
    tracking: bool | None,
    group_launches: bool,
    share_across_devices: bool,
) -> SweepOutcome:
    """`run_sweep` in a directory this driver holds (`created`: made by it, removed again if
    planning fails)."""
    emit = on_event or (lambda kind, payload: None)
    started = time.perf_counter()
    try:
        code = locate_spec_workload(spec)  # an import error costs no Ray start
        _init_ray(address, sweep_dir / "ray.log", verbose, code.runtime_env())
        plan = make_plan(spec, ray_nodes())
        if not plan.runnable:
            raise UserError(_nothing_runs(plan))
    except BaseException:
        if created:
            shutil.rmtree(sweep_dir, ignore_errors=True)  # never leave a half-made sweep
        raise
    _write_sweep_files(sweep_dir, spec, plan)  # as given: a resume compares with that
    spec = plan.spec  # with `resources: auto` chosen (plan.auto_resources)
    emit("planned", {"plan": plan, "sweep_dir": sweep_dir, "finished": finished})

    from amdahl.track import Tracker

    tracker = Tracker(
        spec, sweep_dir, enabled=spec.tracking.enabled if tracking is None else tracking
    )
    tracker.sync(read_results(sweep_dir).to_pylist())  # rows an outage kept from MLflow
    tracker.open_soon()
    outcome = SweepOutcome(sweep_dir=sweep_dir, plan=plan)
    repeats = range(spec.train.repeats)
    done_ids = {
        t.trial_id for t in plan.trials if all((t.trial_id, r) in finished for r in repeats)
    }
    launches = plan.launches(
        skip=done_ids, group=group_launches, across_devices=share_across_devices
    )
    interrupt = _InterruptFlag()
    try:
        with interrupt.installed():
            attempt = 0
            while launches:
                done = finished | {(row["trial_id"], row["repeat"]) for row in outcome.rows}
                relaunch = _run_launches(
                    spec, launches, sweep_dir, done, outcome, tracker, emit, interrupt, attempt
                )
                if interrupt.is_set() or not relaunch:
                    break
                attempt += 1
                launches = plan.launches(
                    skip={t.trial_id for t in plan.runnable} - relaunch,
                    group=group_launches,
                    across_devices=share_across_devices,
                )
    finally:
        outcome.wall_s = time.perf_counter() - started
        _write_report(sweep_dir)
        tracker.finish(outcome, interrupted=interrupt.is_set())
    if interrupt.is_set():
        raise SweepInterrupted(sweep_dir, interrupt.signum or signal.SIGINT)
    emit("finished", {"outcome": outcome})
    return outcome


class _InterruptFlag(tune.Stopper):
    """First Ctrl-C or SIGTERM (what `ray job stop` and batch schedulers send): Tune stops
    scheduling and ends the running launch, and the sweep closes as after Ctrl-C (rows kept,
    report written, MLflow parent run marked KILLED). Second signal: stop at once.

    Rows already written stay intact: results.parquet is only ever replaced atomically.
    """

    #: The signals that stop a sweep cleanly; `signum` is the first one received.
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum: int | None = None

    def is_set(self) -> bool:
        return self._event.is_set()

    def __call__(self, trial_id: str, result: dict) -> bool:
        return self._event.is_set()

    def stop_all(self) -> bool:
        return self._event.is_set()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # lives in the driver only (Tune pickles its stoppers into its state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._event = threading.Event()
        self.signum = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # Handlers set outside Python read as None; SIG_DFL is what they stand for here.
        previous = {s: signal.getsignal(s) or signal.SIG_DFL for s in self.SIGNALS}

        def first(signum: int, frame: Any) -> None:
            self.signum = signum
            self._event.set()
            # A second signal stops at once: Ctrl-C raises KeyboardInterrupt, SIGTERM gets
            # the handler it had before (Ray's driver exits on it).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, previous[signal.SIGTERM])

        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        for s in self.SIGNALS:
            signal.signal(s, first)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _run_launches(
    spec: SweepSpec,
    launches: list[Launch],
    sweep_dir: Path,
    finished: set[tuple[str, int]],
    outcome: SweepOutcome,
    tracker: Any,
    emit: EventHandler,
    interrupt: _InterruptFlag,
    attempt: int = 0,
) -> set[str]:
    """Run these launches under one Tuner; returns the ids of trials to launch again (those a
    crashed launch had not reached, see `_ResultSink.on_trial_error`). `attempt` > 0: such a
    relaunch."""
    session = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    configs = [_launch_config(spec, launch, sweep_dir, finished, session) for launch in launches]
    for config in configs:
        config["relaunch"] = attempt > 0
    datasets = _materialise_datasets(spec, configs)
    by_launch = {launch.launch_id: launch for launch in launches}
    sink = _ResultSink(sweep_dir, by_launch, outcome, tracker, emit)
    concurrency = 1 if spec.isolation == "exclusive" else len(configs)
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(_launch_trainable, datasets=datasets), {"CPU": DRIVER_CPUS}
        ),
        param_space={"launch": tune.grid_search(configs)},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=concurrency,
            trial_name_creator=_launch_name,
            trial_dirname_creator=_launch_name,
        ),
        run_config=tune.RunConfig(
            name="tune" if attempt == 0 else f"tune-relaunch-{attempt}",
            storage_path=ray_storage(spec, sweep_dir),
            callbacks=[sink],
            stop=interrupt,
            verbose=0,
        ),
    )
    tuner.fit()
    return sink.relaunch


def _write_report(sweep_dir: Path) -> None:
    """report.md and report.html from results.parquet; a report bug never costs the sweep."""
    from amdahl.report import write_reports

    try:
        write_reports(sweep_dir)
    except Exception as e:  # noqa: BLE001 - the rows are safe; `platform report` can retry
        logging.getLogger(__name__).warning("could not write the report for %s: %s", sweep_dir, e)


def _launch_name(trial: Any) -> str:
    return f"launch-{trial.config['launch']['launch_id']}"


def _materialise_datasets(spec: SweepSpec, configs: list[dict[str, Any]]) -> dict[str, Any]:
    """What every launch's workers read, put in the object store once by the driver (before any
    worker group holds CPUs) and shared by all launches, so workers on any node reach it (see
    `data.shared_rows`): per training set a Ray Dataset (`ray_data:<key>`) and, for workloads
    without preprocessing, its equal per-rank shards for each device count
    (`shards:<key>:<devices>`); the rows for torch DataLoaders (`torch_loader:<key>`); and the
    user's validation split (`val:<path>`)."""
    from amdahl.data import rank_shards, ray_dataset, shared_rows

    datasets: dict[str, Any] = {}
    for config in configs:
        key = config["dataset_key"]
        train = f"{config['input']}:{key}"
        if train not in datasets:
            datasets[train] = (
                ray_dataset(config["train_path"], spec.resources.cpus_per_data_worker)
                if config["input"] == "ray_data"
                else shared_rows(config["train_path"])
            )
        if config["input"] == "ray_data" and not config["preprocesses"]:
            for world in config["device_counts"]:
                if f"shards:{key}:{world}" not in datasets:
                    datasets[f"shards:{key}:{world}"] = rank_shards(datasets[train], world)
        if config["val_path"] and f"val:{config['val_path']}" not in datasets:
            datasets[f"val:{config['val_path']}"] = shared_rows(config["val_path"])
    return datasets


def _launch_trainable(config: dict[str, Any], datasets: dict[str, Any]) -> None:
    """Tune function trainable: fit one TorchTrainer that runs every trial of one launch."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from amdahl.data import preprocessed, repeated
    from amdahl.harness import rows_per_rank, train_launch

    # Train's controller polls workers for reported rows at this interval (default 2 s): a
    # worker's next report waits for the last one to be collected, so keep it short.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(_POLL_INTERVAL_S))
    # Ray 2.60 starts a preemption watcher process per worker group, for
    # `ray.train.get_preemption_info`, which the harness never reads: one process fewer to
    # start (measured: the first trial started ~0.6 s sooner on 2 cores).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    launch = dict(config["launch"])
    res = launch["resources"]
    if launch["val_path"]:
        launch["val_rows"] = datasets[f"val:{launch['val_path']}"]
    train_data = {}
    per_rank = rows_per_rank(launch)
    if launch["input"] == "torch_loader":
        launch["train_rows"] = datasets[f"torch_loader:{launch['dataset_key']}"]
    elif launch["preprocesses"]:
        # The shared base rows, then this launch's preprocessing with data_workers tasks.
        train_data["train"] = preprocessed(
            datasets[f"ray_data:{launch['dataset_key']}"],
            make_workload(launch["workload"], launch["trials"][0]["settings"]["params"]),
            launch["data_workers"],
            res["cpus_per_data_worker"],
            max(t["settings"]["per_device_batch"] for t in launch["trials"]),
            per_rank * res["workers"],
        )
    else:
        launch["train_shards"] = {
            world: [
                repeated(shard, per_rank)
                for shard in datasets[f"shards:{launch['dataset_key']}:{world}"]
            ]
            for world in launch["device_counts"]
        }
    worker = {"CPU": res["cpus_per_worker"]}
    if res["gpus_per_worker"]:
        worker["GPU"] = res["gpus_per_worker"]
    trainer = TorchTrainer(
        train_launch,
        train_loop_config=launch,
        torch_config=TorchConfig(timeout_s=launch["collective_timeout_s"]),
        scaling_config=ray.train.ScalingConfig(
            num_workers=res["workers"],
            use_gpu=bool(res["gpus_per_worker"]),
            resources_per_worker=worker,
            placement_strategy=launch["placement"],
        ),
        run_config=ray.train.RunConfig(
            name=launch["run_name"],
            storage_path=launch["storage_path"],
            callbacks=[TuneReportCallback()],
            failure_config=ray.train.FailureConfig(max_failures=launch["max_failures"]),
            # The harness's checkpoint is only the list of finished trials; keep the last.
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
        ),
        datasets=train_data or None,
    )
    trainer.fit()


def _launch_config(
    spec: SweepSpec,
    launch: Launch,
    sweep_dir: Path,
    finished: set[tuple[str, int]],
    session: str,
) -> dict[str, Any]:
    """Everything the workers need, as plain data (it crosses process boundaries)."""
    from amdahl.data import dataset_path
    from amdahl.worlds import collective_timeout_s

    r = launch.resources
    t = spec.train
    trials = []
    for trial in launch.trials:
        settings = dict(trial.settings)
        devices, batch = settings["devices"], settings["batch_size"]
        settings["per_device_batch"] = batch // devices if t.scaling == "strong" else batch
        trials.append({"trial_id": trial.trial_id, "settings": settings})
    workload = make_workload(spec.workload, launch.trials[0].settings["params"])
    return {
        "launch_id": launch.launch_id,
        "sweep": spec.name,
        "workload": spec.workload,
        "trials": trials,
        "collective_timeout_s": collective_timeout_s(trials),
        "device_counts": launch.device_counts,
        "skip": sorted(
            [tr.trial_id, r]
            for tr in launch.trials
            for r in range(t.repeats)
            if (tr.trial_id, r) in finished
        ),
        "repeats": t.repeats,
        "steps": t.steps,
        "warmup_steps": t.warmup_steps,
        "seed": t.seed,
        "lr": t.lr,
        "lr_scaling": t.lr_scaling,
        "lr_base_batch": t.lr_base_batch,
        "lr_warmup_steps": t.lr_warmup_steps,
        "target": t.target.model_dump() if t.target else None,
        "optimizer": t.optimizer,
        "scaling": t.scaling,
        "max_failures": t.max_failures,
        "data_workers": launch.trials[0].settings["data_workers"],
        "input": launch.trials[0].settings["input"],
        "train_path": dataset_path(workload, spec.workload, "train", t.seed),
        "val_path": dataset_path(workload, spec.workload, "val", t.seed)
        if workload.source("val")
        else None,
        "torch_threads": max(1, int(r.cpus_per_worker)),
        "flops_per_sample": workload.flops_per_sample(),
        "resources": {
            "workers": r.workers,
            "cpus_per_worker": r.cpus_per_worker,
            "gpus_per_worker": r.gpus_per_worker,
            "cpus_per_data_worker": spec.resources.cpus_per_data_worker,
        },
        "placement": spec.resources.placement.upper(),
        "storage_path": ray_storage(spec, sweep_dir, "train"),
        # Unique per driver session: a worker group restarted by train.max_failures resumes
        # from this run's checkpoint, but a resumed sweep must trust results.parquet alone
        # (the old driver may have died between a worker's report and the row's write).
        "run_name": f"launch-{launch.launch_id}-{session}",
        "dataset_key": json.dumps(workload.data_key(), sort_keys=True),
        "preprocesses": workload.preprocesses,
    }


class _ResultSink(tune.Callback):
    """Tune callback in the driver: every reported row goes to results.parquet, then MLflow."""

    def __init__(
        self,
        sweep_dir: Path,
        launches: dict[str, Launch],
        outcome: SweepOutcome,
        tracker: Any,
        emit: EventHandler,
    ):
        self.sweep_dir, self.launches, self.outcome = sweep_dir, launches, outcome
        self.tracker, self.emit = tracker, emit
        self.reported: dict[str, set[tuple[str, int]]] = {}
        self.relaunch: set[str] = set()  # trial ids a crashed launch had not reached

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into its experiment state; this one lives only in the
        # driver (resume goes through results.parquet, not Tune's restore), so ship nothing.
        return {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        launch_id = trial.config["launch"]["launch_id"]
        self.emit("launch_started", {"launch": self.launches[launch_id]})

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if ROW_KEY not in result:
            return
        row = json.loads(result[ROW_KEY])
        launch_id = trial.config["launch"]["launch_id"]
        self.reported.setdefault(launch_id, set()).add((row["trial_id"], row["repeat"]))
        self._record(row)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """The launch died (its worker group crashed past train.max_failures).

        Its trials run in order, so the first repeat it had not reported is the one it died
        in: that one is recorded as failed with the reason, and the trials it had not reached
        go to a new launch (`relaunch`), so one crash costs one trial, not the whole group. A
        relaunch that dies in its first trial again has a cause no trial escapes (a worker
        group that cannot start, say): then every repeat it had left is recorded as failed.
        """
        config = trial.config["launch"]
        error = _launch_error(trial)
        reported = self.reported.get(config["launch_id"], set())
        done = reported | {(t, r) for t, r in config["skip"]}
        pending = [
            (t, repeat)
            for t in config["trials"]
            for repeat in range(config["repeats"])
            if (t["trial_id"], repeat) not in done
        ]
        failing = pending if config["relaunch"] and not reported else pending[:1]
        self.relaunch.update(t["trial_id"] for t, _ in pending[len(failing) :])
        for t, repeat in failing:
            self._record(_failed_row(config, t, repeat, error))

    def _record(self, row: dict[str, Any]) -> None:
        append_rows(self.sweep_dir, [row])
        self.outcome.rows.append(row)
        self.tracker.log_trial_soon(row)
        self.emit("trial_done", {"row": row})


def _failed_row(
    config: dict[str, Any], trial: dict[str, Any], repeat: int, error: str
) -> dict[str, Any]:
    s = trial["settings"]
    return {
        "sweep": config["sweep"],
        "trial_id": trial["trial_id"],
        "repeat": repeat,
        "launch_id": config["launch_id"],
        "workload": config["workload"],
        "params": json.dumps(s["params"], sort_keys=True),
        **{k: s[k] for k in SETTING_COLUMNS},
        "batch_size": s["per_device_batch"],
        "scaling": config["scaling"],
        "status": failure_status(error),
        "error": error,
        "steps": config["steps"],
        "warmup_steps": config["warmup_steps"],
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _launch_error(trial: Any) -> str:
    """The last line of the launch's error (e.g. a worker's exception). Tune writes it to the
    trial's local error file before calling `on_trial_error`; its storage copy (`get_error`)
    is synced later, so the local file comes first."""
    text = ""
    path = getattr(trial, "error_file", None)
    if path and os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text:
        error = trial.get_error() if hasattr(trial, "get_error") else None
        text = str(error) if error else ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return (
            "launch failed: the launch's worker group failed without an error; see ray.log in "
            "the sweep directory"
        )
    return "launch failed: " + lines[-1][:2000]


# --------------------------------------------------------------------------- helpers


def _init_ray(
    address: str | None,
    log_path: Path,
    verbose: bool,
    runtime_env: dict[str, Any] | None = None,
) -> None:
    """Connect (or start local Ray) with Ray's chatter kept out of the terminal unless -v.

    `runtime_env` (WorkloadCode.runtime_env: the user's workload code as py_modules) becomes
    the job's, so every Ray worker of the sweep (train workers, Ray Data tasks, Tune trials) on
    every node imports the same code. A Ray this process initialised before keeps its own
    runtime_env: whoever called ray.init passes `runtime_env=locate_spec_workload(spec)
    .runtime_env()` to it (else workers import the code only where their sys.path has it).
    """
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not verbose:
        os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        _route_ray_logs(log_path)
    if ray.is_initialized():
        if runtime_env and not ray.get_runtime_context().runtime_env.get("py_modules"):
            logging.getLogger(__name__).warning(
                "Ray was initialised without the workload's code in its runtime_env (%s): "
                "workers import it only where their sys.path finds it",
                runtime_env["py_modules"],
            )
        return
    kwargs: dict[str, Any] = {
        "log_to_driver": verbose,
        "include_dashboard": False,
        "logging_level": logging.INFO if verbose else logging.WARNING,
    }
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(address="local", num_cpus=os.cpu_count(), **kwargs)  # never join a stray one


def _route_ray_logs(log_path: Path) -> None:
    handler = logging.FileHandler(touch_private(log_path))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False


def ray_storage(spec: SweepSpec, sweep_dir: Path, *sub: str) -> str:
    """Where Ray Tune and Train keep this sweep's state: `<storage>/<sweep dir name>/...` when
    the spec names shared storage (one folder per sweep, so sweeps never collide), else
    `<sweep dir>/ray/...` on the driver's disk (single-node plans only, see check_storage)."""
    if spec.storage is None:
        return str(Path(sweep_dir, "ray", *sub).resolve())
    return "/".join([spec.storage.rstrip("/"), Path(sweep_dir).name, *sub])


#: The UTC time in a sweep directory's name, `<name>-<stamp>` (then `-2`, `-3`... when several
#: sweeps of one name start in the same second).
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_STAMP = r"\d{8}T\d{6}Z(?:-\d+)?"


def _new_sweep_dir(runs_dir: Path, name: str) -> Path:
    """A new `<name>-<UTC time>` directory that this call alone made: mkdir refuses one that
    exists (another driver's, started in the same second), and the next suffix is tried."""
    stamp = datetime.now(timezone.utc).strftime(STAMP_FORMAT)
    runs_dir.mkdir(parents=True, exist_ok=True)
    for suffix in itertools.count(1):
        path = runs_dir / (f"{name}-{stamp}" if suffix == 1 else f"{name}-{stamp}-{suffix}")
        try:
            private_dir(path)  # owner-only: the files inside can hold configuration
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def _write_sweep_files(sweep_dir: Path, spec: SweepSpec, plan: SweepPlan) -> None:
    write_private(sweep_dir / SPEC_FILE, yaml.safe_dump(spec.model_dump(), sort_keys=False))
    write_private(sweep_dir / PLAN_FILE, json.dumps(plan_summary(plan), indent=1))
    write_fingerprint(sweep_dir, spec)


def plan_summary(plan: SweepPlan) -> dict[str, Any]:
    """The plan as plain data (written to plan.json, shown by `platform plan --json`)."""

    def trial(t: Trial) -> dict[str, Any]:
        return {
            "trial_id": t.trial_id,
            "label": t.label(),
            "settings": t.settings,
            "resources": t.resources.describe(),
            "refused": t.refused,
        }

    return {
        "nodes": [vars(n) for n in plan.nodes],
        "resources": plan.spec.resources.model_dump(),
        "resource_note": plan.resource_note,
        "trials": [trial(t) for t in plan.trials],
        "launches": [
            {"launch_id": launch.launch_id, "trials": [t.trial_id for t in launch.trials]}
            for launch in plan.launches()
        ],
    }


def _nothing_runs(plan: SweepPlan) -> str:
    lines = ["no trial of this sweep can run here:"]
    lines += [f"  {t.label()}: {t.refused}" for t in plan.refused[:10]]
    if len(plan.refused) > 10:
        lines.append(f"  ... and {len(plan.refused) - 10} more")
    return "\n".join(lines)


def _check_resumable(sweep_dir: Path) -> None:
    if not (Path(sweep_dir) / RESULTS_FILE).exists() and not (Path(sweep_dir) / SPEC_FILE).exists():
        raise UserError(
            f"{sweep_dir}: nothing to resume (no {RESULTS_FILE} or {SPEC_FILE}); "
            "pass a directory made by `platform sweep`"
        )


def finished_trials(sweep_dir: Path, retry_failed: bool = False) -> set[tuple[str, int]]:
    """(trial_id, repeat) pairs with a final row in a sweep directory (ok ones only, when
    failed ones are to be retried)."""
    _check_resumable(sweep_dir)
    table = read_results(sweep_dir)
    ids, repeats, status = (table[c].to_pylist() for c in ("trial_id", "repeat", "status"))
    return {
        (i, r)
        for i, r, s in zip(ids, repeats, status, strict=True)
        if s == "ok" or not retry_failed
    }


def latest_sweep_dir(runs_dir: str | Path, name: str) -> Path:
    """The newest `runs/<name>-<UTC time>` directory, for `--resume` without a directory: the
    name must match exactly, so sweep `scaling` never picks `scaling-big-<UTC time>`. Newest
    is the last written to; a directory whose driver still runs is picked, then refused by
    its lock (see `lock_sweep_dir`)."""
    own = re.compile(re.escape(name) + "-" + _STAMP)
    candidates = sorted(
        (p for p in Path(runs_dir).glob(f"{name}-*") if own.fullmatch(p.name) and p.is_dir()),
        key=lambda p: p.stat().st_mtime,
    )
    if not candidates:
        raise UserError(
            f"--resume: no earlier sweep named {name!r} under {runs_dir}/ (a directory named "
            f"{name}-<UTC time>, e.g. {name}-20250101T120000Z); "
            "pass the sweep directory explicitly"
        )
    return candidates[-1]


# --------------------------------------------------------------------------- the run directory

#: Held (flock) by the driver writing a sweep directory, for its whole run; it names that
#: driver (pid, host, start) for the next one that tries.
LOCK_FILE = "driver.lock"
#: The settings a sweep directory's rows were measured under, and their hash.
FINGERPRINT_FILE = "fingerprint.json"
#: Sweep-file fields that do not change what a trial measures, left out of the fingerprint so
#: a resume may change them: names and bookkeeping (`name`, `tracking`, `report`, `storage`),
#: retries of a crashed launch (`train.max_failures`), the number of repeats (a resume with
#: more runs the missing ones) and which trials exist (`grid`, `exclude`: a resume with a larger
#: grid runs the new trials; each row records its own axis values). Everything else
#: (`workload`, `params`, the rest of `train`, `options`, `resources`, `isolation`) is in it.
UNMEASURED_FIELDS = (
    "name",
    "tracking",
    "report",
    "storage",
    "grid",
    "exclude",
    "train.repeats",
    "train.max_failures",
)


class DirLock:
    """A sweep directory held by this process (see `lock_sweep_dir`) until `release`."""

    def __init__(self, path: Path, file: Any):
        self.path, self._file = path, file

    def release(self) -> None:
        self._file.close()  # closing the file drops the lock


def lock_sweep_dir(sweep_dir: Path) -> DirLock:
    """Hold `sweep_dir` for this driver: an exclusive flock on `driver.lock` inside it.

    A second driver (a `--resume` of a sweep that still runs, in another terminal or on another
    host of a shared filesystem) is refused with exit 2, naming the holder's pid and host. The
    kernel drops the lock when its process ends, however it ends (SIGKILL, OOM kill), so a
    killed driver's directory resumes at once; the file stays and names the last holder.
    """
    path = Path(sweep_dir) / LOCK_FILE
    try:
        file = open(path, "a+")  # noqa: SIM115 - stays open as long as the lock is held
    except OSError as e:
        raise UserError(
            f"{sweep_dir}: cannot create {LOCK_FILE} there ({e.strerror or e}); a sweep "
            "directory must be writable by the driver"
        ) from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(file)
        file.close()
        raise UserError(
            f"{sweep_dir} is in use by another sweep driver ({holder}); two drivers in one "
            "directory would run the same trials twice, spoil each other's timings and "
            "overwrite each other's files. Wait for it to end, or stop it (Ctrl-C in its "
            "terminal, or `kill -INT <pid>` on its host) and resume then; or drop --resume "
            "to start a new sweep directory"
        ) from None
    except OSError as e:
        file.close()
        raise UserError(
            f"{sweep_dir}: cannot lock {LOCK_FILE} ({e.strerror or e}); keep sweep "
            "directories on a filesystem with file locks (a local disk, or NFS with locking)"
        ) from None
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    file.seek(0)
    file.truncate()
    file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}))
    file.flush()
    return DirLock(path, file)


def _lock_holder(file: Any) -> str:
    """Who holds the lock, as its lock file says (the holder writes it just after locking)."""
    for _ in range(20):
        file.seek(0)
        try:
            holder = json.loads(file.read() or "null")
        except ValueError:
            holder = None
        if isinstance(holder, dict) and "pid" in holder:
            return (
                f"pid {holder['pid']} on host {holder.get('host', '?')}, "
                f"running since {holder.get('since', '?')}"
            )
        time.sleep(0.05)
    return f"pid and host not recorded in {file.name}"


def _open_sweep_dir(
    spec: SweepSpec,
    runs_dir: Path,
    resume: str | Path | None,
    retry_failed: bool,
    new_if_changed: bool,
) -> tuple[Path, set[tuple[str, int]], DirLock, bool]:
    """The sweep directory this driver writes, locked (see `lock_sweep_dir`); the trial
    repeats already finished there; whether this call made it."""
    if resume is not None:
        sweep_dir = Path(resume)
        _check_resumable(sweep_dir)  # before locking: no lock file in a foreign directory
        lock = lock_sweep_dir(sweep_dir)
        try:
            changes = spec_changes(sweep_dir, spec)
            if not changes:  # a broken results table fails here
                return sweep_dir, finished_trials(sweep_dir, retry_failed), lock, False
            if not new_if_changed:
                raise UserError(_changed_message(sweep_dir, changes))
        except BaseException:
            lock.release()
            raise
        lock.release()
        logging.getLogger(__name__).warning(
            "%s was measured with other settings (%s): starting a new sweep directory",
            sweep_dir,
            "; ".join(_show_change(c) for c in changes[:3]),
        )
    sweep_dir = _new_sweep_dir(runs_dir, spec.name)
    try:
        return sweep_dir, set(), lock_sweep_dir(sweep_dir), True
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


def spec_fingerprint(spec: SweepSpec) -> tuple[str, dict[str, Any]]:
    """A hash of what `spec` sets that changes what is measured (all but UNMEASURED_FIELDS),
    and that content, as written to `fingerprint.json`."""
    measured = _measured(spec.model_dump(mode="json"))
    blob = json.dumps(measured, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16], measured


def write_fingerprint(sweep_dir: Path, spec: SweepSpec) -> None:
    """Record in `sweep_dir` the settings its rows are measured under (written whole, through
    a temporary file of its own)."""
    fingerprint, measured = spec_fingerprint(spec)
    record = {"fingerprint": fingerprint, "measured": measured}
    write_private(Path(sweep_dir) / FINGERPRINT_FILE, json.dumps(record, indent=1))


def spec_changes(sweep_dir: Path, spec: SweepSpec) -> list[tuple[str, Any, Any]]:
    """(dotted path, old value, new value) for each measured setting that `spec` changes from
    those `sweep_dir`'s rows were measured under; [] when none (or the directory records
    none). The record is `fingerprint.json`, else (a directory written before it existed)
    `spec.yaml`. A field the record lacks counts as changed only when `spec` sets it to other
    than its default (fields added to amdahl later do not block a resume)."""
    recorded = _recorded_measurement(Path(sweep_dir))
    if recorded is None:
        return []
    fingerprint, measured = spec_fingerprint(spec)
    if recorded[0] == fingerprint:
        return []
    default_spec = SweepSpec.model_validate({"workload": spec.workload})
    defaults = _measured(default_spec.model_dump(mode="json"))
    return [
        (path, old, new)
        for path, old, new in _differences(recorded[1], measured)
        if not _only_a_default(path, old, new, defaults) and not _auto_resolves(path, new)
    ]


def _auto_resolves(path: str, new: Any) -> bool:
    """`resources: auto` (null) against a recorded number is no change of the spec: the planner
    picks the number, and the trial ids (which hash the resources used) keep rows measured
    under other numbers apart from the new ones."""
    return path in ("resources.cpus_per_device", "resources.cpus_per_data_worker") and new is None


_ABSENT = object()


def _measured(dumped: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(dumped, default=str))
    for dotted in UNMEASURED_FIELDS:
        *parents, leaf = dotted.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def _recorded_measurement(sweep_dir: Path) -> tuple[str | None, dict[str, Any]] | None:
    problems = []
    fingerprint_path, spec_path = sweep_dir / FINGERPRINT_FILE, sweep_dir / SPEC_FILE
    if fingerprint_path.exists():
        try:
            record = json.loads(fingerprint_path.read_text())
            fingerprint, measured = record.get("fingerprint"), record.get("measured")
            if isinstance(fingerprint, str) and isinstance(measured, dict):
                return fingerprint, measured
            problems.append(f"{fingerprint_path}: not a fingerprint record")
        except (OSError, ValueError, AttributeError) as e:
            problems.append(f"{fingerprint_path}: unreadable ({_one_line(e)})")
    if spec_path.exists():
        from amdahl.spec import validate_spec

        try:
            raw = yaml.safe_load(spec_path.read_text())
        except (OSError, yaml.YAMLError) as e:
            problems.append(f"{spec_path}: unreadable ({_one_line(e)})")
        else:
            if isinstance(raw, dict):
                try:
                    raw = validate_spec(raw, source=str(spec_path)).model_dump(mode="json")
                except UserError:
                    pass  # written by another amdahl version: compare what it says
                return None, _measured(raw)
            problems.append(f"{spec_path}: not a sweep file")
    if problems:
        raise UserError(
            f"--resume {sweep_dir}: cannot tell which settings its rows were measured under "
            f"({'; '.join(problems)}); restore the file, or add --new-if-changed to start a "
            "new sweep directory"
        )
    return None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _differences(old: Any, new: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys(), key=str):
            sub = f"{path}.{key}" if path else str(key)
            yield from _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), sub)
    elif old != new:
        yield path, old, new


def _only_a_default(path: str, old: Any, new: Any, defaults: dict[str, Any]) -> bool:
    if old is not _ABSENT and new is not _ABSENT:
        return False
    node: Any = defaults
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return (new if old is _ABSENT else old) == node


def _show_change(change: tuple[str, Any, Any]) -> str:
    path, old, new = change
    show = lambda v: "(unset)" if v is _ABSENT else json.dumps(v)  # noqa: E731
    return f"{path}: {show(old)} -> {show(new)}"


def _changed_message(sweep_dir: Path, changes: list[tuple[str, Any, Any]]) -> str:
    lines = [
        f"--resume {sweep_dir}: these settings differ from the ones its rows were measured "
        "under (old -> new):"
    ]
    lines += [f"  {_show_change(c)}" for c in changes[:12]]
    if len(changes) > 12:
        lines.append(f"  ... and {len(changes) - 12} more")
    lines.append(
        "resuming would put rows measured under different settings side by side. Resume "
        f"with the settings in {sweep_dir / SPEC_FILE}, or add --new-if-changed to start a "
        "new sweep directory with these (as running without --resume does)"
    )
    return "\n".join(lines)
