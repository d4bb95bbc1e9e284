"""Driver side: plan, then let Ray Tune schedule launches, each fitting one Ray Train TorchTrainer.

A launch is one worker group that runs several trials one after another (see plan.Launch), which
is what keeps orchestration cheap. Results stream back through Tune: the harness reports one row
per trial repeat, `TuneReportCallback` forwards it to the launch's Tune trial, and `_ResultSink`
(a Tune callback running here, in the driver) appends it to results.parquet and mirrors it to
MLflow. The driver is the only writer of both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from amdahl.driver.cluster import connect_ray, make_plan, ray_nodes
from amdahl.errors import UserError
from amdahl.plan.trials import DRIVER_CPUS, Launch, SweepPlan
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.layout import SweepDir, open_sweep_dir, ray_storage, write_sweep_files
from amdahl.sweepdir.table import append_rows, read_results
from amdahl.worker.contract import LaunchConfig, TrialConfig, WorkerResources
from amdahl.worker.rows import ROW_REPORT_KEY, failure_status, row_identity
from amdahl.workload import locate_spec_workload, make_workload

if TYPE_CHECKING:
    from amdahl.search.halving import SearchState
    from amdahl.track.tracker import Tracker

#: Events the runner emits for whoever renders progress: (kind, payload).
EventHandler = Callable[[str, dict[str, Any]], None]

_POLL_INTERVAL_S = 0.25


@dataclass
class SweepOutcome:
    sweep_dir: Path
    plan: SweepPlan
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    #: search: halving: where the search ended (search.SearchState), else None.
    search: SearchState | None = None

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") != "ok"]


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
    measurement settings differ from the directory's is refused (see `sweepdir.spec_changes`),
    or with `new_if_changed` starts a new directory instead. The sweep directory is locked for
    the whole run (see `sweepdir.lock_sweep_dir`): a second driver there is refused.
    `group_launches=False` starts one worker group per trial, `share_across_devices=False` one
    per device count (both for overhead comparisons).
    Raises SweepInterrupted after a first Ctrl-C or SIGTERM has stopped it cleanly.
    """
    from amdahl.search.halving import check

    check(spec)  # pure: a search section that cannot run creates no directory
    runs_dir = Path(runs_dir)
    fresh_runs_dir = not runs_dir.exists()
    sweep_dir, finished, lock, created = open_sweep_dir(
        spec, runs_dir, resume, retry_failed, new_if_changed
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
    except BaseException:
        if fresh_runs_dir and not sweep_dir.exists():  # planning failed: leave no trace
            with contextlib.suppress(OSError):
                runs_dir.rmdir()
        raise
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
        connect_ray(address, SweepDir(sweep_dir).ray_log, verbose, code.runtime_env())
        plan = make_plan(spec, ray_nodes())
        if not plan.runnable:
            raise UserError(_nothing_runs(plan))
    except BaseException:
        if created:
            shutil.rmtree(sweep_dir, ignore_errors=True)  # never leave a half-made sweep
        raise
    write_sweep_files(sweep_dir, spec, plan)  # as given: a resume compares with that
    spec = plan.spec  # with `resources: auto` chosen (plan.auto_resources)
    emit("planned", {"plan": plan, "sweep_dir": sweep_dir, "finished": finished})

    from amdahl.track.tracker import Tracker

    tracker = Tracker(
        spec, sweep_dir, enabled=spec.tracking.enabled if tracking is None else tracking
    )
    tracker.sync(read_results(sweep_dir).to_pylist())  # rows an outage kept from MLflow
    tracker.open_soon()
    outcome = SweepOutcome(sweep_dir=sweep_dir, plan=plan)
    interrupt = _InterruptFlag()
    run = _Measurement(
        spec,
        plan,
        sweep_dir,
        outcome,
        tracker,
        emit,
        interrupt,
        group_launches,
        share_across_devices,
    )
    try:
        with interrupt.installed():
            if spec.search.method == "halving":
                outcome.search = _halving(run)
            else:
                run.measure({t.trial_id for t in plan.runnable}, finished)
    finally:
        outcome.wall_s = time.perf_counter() - started
        _write_report(sweep_dir)
        tracker.finish(outcome, interrupted=interrupt.is_set())
    if interrupt.is_set():
        raise SweepInterrupted(sweep_dir, interrupt.signum or signal.SIGINT)
    emit("finished", {"outcome": outcome})
    return outcome


@dataclass
class _Measurement:
    """What measuring a set of trials needs (a grid sweep measures all of them once; a search
    measures subsets, each rung with its own step count)."""

    spec: SweepSpec
    plan: SweepPlan
    sweep_dir: Path
    outcome: SweepOutcome
    tracker: Tracker
    emit: EventHandler
    interrupt: _InterruptFlag
    group: bool
    across_devices: bool

    def record(self, row: dict[str, Any]) -> None:
        """A row is final: into results.parquet first (the source of truth), then MLflow."""
        append_rows(self.sweep_dir, [row])
        self.outcome.rows.append(row)
        self.tracker.log_trial_soon(row)
        self.emit("trial_done", {"row": row})

    def measure(
        self, trial_ids: set[str], finished: set[tuple[str, int]], rung: int | None = None
    ) -> None:
        """Run `trial_ids` (every repeat not in `finished`) in launches, launching again the
        trials a crashed launch had not reached. `rung`: a search rung, measured with its
        own `train.steps` (search.rung_steps)."""
        from amdahl.search.halving import ranks_only, rung_steps

        spec = self.spec if rung is None else _rung_spec(self.spec, rung)
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
                (row["trial_id"], row["repeat"])
                for row in self.outcome.rows
                if row.get("rung") == rung
            }
            relaunch = _run_launches(spec, launches, self, done, attempt, rung, ranking_only)
            if self.interrupt.is_set() or not relaunch:
                return
            attempt += 1
            skip = {t.trial_id for t in self.plan.runnable} - relaunch
            launches = self.plan.launches(skip, self.group, self.across_devices)


def _rung_spec(spec: SweepSpec, rung: int) -> SweepSpec:
    """The spec a search rung runs: `train.steps` (time-to-target: `target.max_steps`) cut to
    the rung's length, and the rung's repeats (search.rung_repeats)."""
    from amdahl.search.halving import rung_repeats, rung_steps

    steps = rung_steps(spec.search, spec.train)[rung]
    train = spec.train.model_copy(update={"repeats": rung_repeats(spec.search, spec.train, rung)})
    if train.target is not None:
        target = train.target.model_copy(update={"max_steps": steps})
        train = train.model_copy(update={"target": target})
    else:
        train = train.model_copy(update={"steps": steps})
    return spec.model_copy(update={"train": train})


def _halving(run: _Measurement) -> SearchState | None:
    """search: halving (search.py): the first rung over every configuration (the step-time
    model's skips recorded as rows), then each rung over the survivors of the one before.
    Where it stands comes from results.parquet every time, so a resumed search goes on from
    the rung it was in. Returns where it ended (None when interrupted)."""
    from amdahl.search import halving as search

    spec = run.spec
    rows = read_results(run.sweep_dir).to_pylist()
    candidates = {t.trial_id for t in run.plan.runnable}
    if not search.replay(rows, spec.search, spec.train).rungs:
        skipped = {r["trial_id"] for r in rows if r.get("status") == search.SKIPPED}
        first = _rung0_identities(run, candidates - skipped)
        anchors = set(search.anchors(list(first.values())))
        if not skipped and spec.search.skip_below is not None and anchors != set(first):
            run.measure(anchors, _measured_at(rows, 0), rung=0)
            if run.interrupt.is_set():
                return None
            _calibrate_for_search(run)
            rows = read_results(run.sweep_dir).to_pylist()
            measured = [r for r in rows if r.get("rung") == 0 and r["trial_id"] in anchors]
            rest = [first[t] for t in first if t not in anchors]
            calibration = search.calibration(spec, SweepDir(run.sweep_dir).calibration)
            reasons = search.predicted_skips(
                measured, rest, spec.search, spec.options.model_dump(), calibration
            )
            for tid, reason in reasons.items():
                run.record({**first[tid], "status": search.SKIPPED, "error": reason})
            skipped = set(reasons)
        rows = read_results(run.sweep_dir).to_pylist()
        run.measure(candidates - skipped, _measured_at(rows, 0), rung=0)
    while not run.interrupt.is_set():
        rows = read_results(run.sweep_dir).to_pylist()
        state = search.replay(rows, spec.search, spec.train)
        if state.finished or not state.rungs:
            return state  # where the search ended, for the closing summary
        nxt = state.rungs[-1].index + 1
        run.measure(set(state.rungs[-1].kept), _measured_at(rows, nxt), rung=nxt)
    return None


def _calibrate_for_search(run: _Measurement) -> None:
    """search.calibration: auto: the all-reduce alpha-beta the step-time model's skips need,
    measured in this sweep's Ray on the grid's largest worker group (as `platform calibrate`
    does), into the sweep directory, where the report reads it too. A resumed search reuses
    it. Skipped when nothing in the grid communicates across devices."""
    from amdahl.driver.calibrate import run_calibration
    from amdahl.search.halving import AUTO_CALIBRATION

    spec = run.spec
    target = SweepDir(run.sweep_dir).calibration
    devices = max(t.settings["devices"] for t in run.plan.runnable)
    if spec.search.calibration != AUTO_CALIBRATION or target.exists() or devices < 2:
        return
    workers = max((t.resources for t in run.plan.runnable), key=lambda r: r.workers)
    run.emit("calibrating", {"devices": devices})
    run_calibration(
        devices,
        run.sweep_dir,
        resources_per_worker={"CPU": workers.cpus_per_worker},
        use_gpu=spec.resources.use_gpu,
    )


def _measured_at(rows: list[dict[str, Any]], rung: int) -> set[tuple[str, int]]:
    """(trial_id, repeat) pairs with a row in `rung`: a resumed rung skips them."""
    return {(r["trial_id"], r["repeat"]) for r in rows if r.get("rung") == rung}


def _rung0_identities(run: _Measurement, trial_ids: set[str]) -> dict[str, dict[str, Any]]:
    """Row-shaped identity columns of the first rung's trials (what a skipped row records)."""
    spec = _rung_spec(run.spec, 0)
    out = {}
    for launch in run.plan.launches({t.trial_id for t in run.plan.trials} - trial_ids):
        config = launch_config(spec, launch, run.sweep_dir, set(), "plan", rung=0)
        for trial in config.trials:
            out[trial.trial_id] = {**row_identity(config, trial, 0), "wall_s": 0.0}
    return out


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
    run: _Measurement,
    finished: set[tuple[str, int]],
    attempt: int = 0,
    rung: int | None = None,
    ranking_only: bool = False,
) -> set[str]:
    """Run these launches under one Tuner; returns the ids of trials to launch again (those a
    crashed launch had not reached, see `_ResultSink.on_trial_error`). `attempt` > 0: such a
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
    sink = _ResultSink(by_launch, {c.launch_id: c for c in configs}, run)
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


def _write_report(sweep_dir: Path) -> None:
    """report.md and report.html from results.parquet; a report bug never costs the sweep."""
    from amdahl.report import write_reports

    try:
        write_reports(sweep_dir)
    except Exception as e:  # noqa: BLE001 - the rows are safe; `platform report` can retry
        logging.getLogger(__name__).warning("could not write the report for %s: %s", sweep_dir, e)


def _launch_name(trial: Any) -> str:
    return f"launch-{trial.config['launch_id']}"


def _materialise_datasets(spec: SweepSpec, configs: list[LaunchConfig]) -> dict[str, Any]:
    """What every launch's workers read, put in the object store once by the driver (before any
    worker group holds CPUs) and shared by all launches, so workers on any node reach it (see
    `data.put_rows`): per training set a Ray Dataset (`ray_data:<key>`) and, for workloads
    without preprocessing, its equal per-rank shards for each device count
    (`shards:<key>:<devices>`); the rows for torch DataLoaders (`torch_loader:<key>`); and the
    user's validation split (`val:<path>`)."""
    from amdahl.data.storage import put_rows, rank_shards, ray_dataset

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

    from amdahl.data.storage import repeat_to_cover, with_preprocessing
    from amdahl.worker.harness import rows_per_launch, rows_per_rank, train_launch

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
    """The workers' contract for one launch (launch.py): plain data that crosses processes."""
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


class _ResultSink(tune.Callback):
    """Tune callback in the driver: every reported row goes to results.parquet, then MLflow."""

    def __init__(
        self, launches: dict[str, Launch], configs: dict[str, LaunchConfig], run: _Measurement
    ):
        self.launches, self.configs, self.run = launches, configs, run
        self.reported: dict[str, set[tuple[str, int]]] = {}
        self.relaunch: set[str] = set()  # trial ids a crashed launch had not reached

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into its experiment state; this one lives only in the
        # driver (resume goes through results.parquet, not Tune's restore), so ship nothing.
        return {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.run.emit("launch_started", {"launch": self.launches[trial.config["launch_id"]]})

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        if ROW_REPORT_KEY not in result:
            return
        row = json.loads(result[ROW_REPORT_KEY])
        launch_id = trial.config["launch_id"]
        self.reported.setdefault(launch_id, set()).add((row["trial_id"], row["repeat"]))
        self.run.record(row)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """The launch died (its worker group crashed past train.max_failures).

        Its runs go in `LaunchConfig.schedule` order, so the first it had not reported is the
        one it died in: that one is recorded as failed with the reason, and the trials with
        repeats it had not reached go to a new launch (`relaunch`), so one crash costs one
        trial run, not the whole group. A relaunch that dies in its first run again has a
        cause no trial escapes (a worker group that cannot start, say): then every repeat it
        had left is recorded as failed.
        """
        launch = self.configs[trial.config["launch_id"]]
        error = _launch_error(trial)
        reported = self.reported.get(launch.launch_id, set())
        done = reported | set(launch.skip)
        pending = [(t, r) for t, r in launch.schedule() if (t.trial_id, r) not in done]
        failing = pending if launch.relaunch and not reported else pending[:1]
        self.relaunch.update(t.trial_id for t, _ in pending[len(failing) :])
        for t, repeat in failing:
            self.run.record(
                {**row_identity(launch, t, repeat), "status": failure_status(error), "error": error}
            )


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


def _nothing_runs(plan: SweepPlan) -> str:
    lines = ["no trial of this sweep can run here:"]
    lines += [f"  {t.label()}: {t.refused}" for t in plan.refused[:10]]
    if len(plan.refused) > 10:
        lines.append(f"  ... and {len(plan.refused) - 10} more")
    return "\n".join(lines)
