"""`Measurement`: measuring a set of trials in the sweep's warm worker groups.

`Measurement.measure` turns a set of trials (all of a grid sweep, or one rung of a search:
`rung_spec`) into work items, one per trial repeat, and hands them to the sweep's `LaunchPool`
(driver/pool.py), whose launches, one per worker-group shape, live for the whole sweep. Rows come
back through the pool and are recorded by `Measurement.record`, the only writer of
results.parquet and MLflow. `Measurement.calibrate` measures calibration.json in the live
launch with the most workers. A launch's trainable, its datasets and the workers' contract for
it (protocol.contract) are driver/trainable.py's.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdahl import strategies
from amdahl.columns import TrialSettings
from amdahl.driver import calibration_reuse
from amdahl.driver.events import (
    Calibrating,
    CalibrationReused,
    EventHandler,
    RungStarted,
    TrialDone,
)
from amdahl.driver.pool import LaunchPool
from amdahl.driver.signals import InterruptFlag
from amdahl.driver.traces import keep_traces
from amdahl.plan.launches import Launch, SweepPlan
from amdahl.protocol.items import WorkItem, item_key
from amdahl.search.halving import ranks_only, rung_repeats, rung_steps
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.layout import SweepDir
from amdahl.sweepdir.table import append_rows

if TYPE_CHECKING:
    from amdahl.track.tracker import Tracker

#: A row whose measured window was shorter than this (seconds) reaches MLflow once the sweep has
#: stopped measuring, not as it arrives. A child run costs the driver ~0.1 s of CPU (an SQLite
#: insert per metric of its curves), spent while the next trial's window is open: beside two
#: ranks on a 2-core laptop that cut 60-step windows' throughput by a median 3-6%
#: (benchmarks/driver_writes.py). From 10 s on it is at most 1% of a window, and a long sweep's
#: runs show in MLflow as they finish.
MIRROR_AT_ONCE_FROM_S = 10.0

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
        """A row is final: into results.parquet first (the source of truth), then MLflow: at
        once where its window was long, else once measuring is over (`mirror_held`)."""
        row = keep_traces(self.sweep_dir, row)  # the profiler traces: files and columns
        append_rows(self.sweep_dir, [row])
        self.rows.append(row)
        window = row.get("item_measured_s") or row.get("measured_s") or 0.0
        if window >= MIRROR_AT_ONCE_FROM_S:
            self.tracker.log_trial_soon(row)
        else:
            self.held_from_mlflow.append(row)
        self.emit(TrialDone(row))

    def mirror_held(self) -> None:
        """No window is open any more: the rows held from MLflow go to the tracker's thread
        (written while the launches end; `Tracker.finish` waits for them)."""
        for row in self.held_from_mlflow:
            self.tracker.log_trial_soon(row)
        self.held_from_mlflow.clear()

    pool: LaunchPool | None = None
    #: Wall seconds the driver spent waiting for calibration items (the summary's, benchmarks').
    calibration_s: float = 0.0
    #: Measure the calibration even where an earlier sweep's on this cluster shape is reusable.
    recalibrate: bool = False
    #: The earlier sweep's calibration this one reused, if it did.
    calibration_reused: calibration_reuse.Reusable | None = None
    #: Rows recorded with a short window, not yet given to MLflow (`record`, `mirror_held`).
    held_from_mlflow: list[dict[str, Any]] = field(default_factory=list)

    def measure(
        self, trial_ids: set[str], finished: set[tuple[str, int]], rung: int | None = None
    ) -> None:
        """Run `trial_ids` (every repeat not in `finished`) in the sweep's launches. `rung`: a
        search rung, measured with its own `train.steps` (search.halving.rung_steps) and repeats."""
        spec = self.spec if rung is None else rung_spec(self.spec, rung)
        ranking_only = ranks_only(self.spec.search, self.spec.train, rung)
        repeats = range(spec.train.repeats)
        todo = {tid for tid in trial_ids if not all((tid, r) in finished for r in repeats)}
        steps = None
        if rung is not None:
            all_steps = rung_steps(self.spec.search, self.spec.train)
            steps = all_steps[rung]
            self.emit(RungStarted(rung, len(all_steps), steps, todo))
        # Repeat 0 of every trial, then repeat 1, ..., each launch's trials fewest devices
        # first: interleaved, a drift of the machine over the launch (another job, a warming
        # cache, a throttling clock) falls on every configuration's repeats alike.
        items = [
            WorkItem(
                item_key(t.trial_id, r, rung),
                lid,
                t.trial_id,
                r,
                rung,
                steps,
                ranking_only,
                **continuation(self.spec, t.trial_id, t.settings, r, rung),
            )
            for r in repeats
            for lid, shape in self._pool().shapes.items()
            for t in shape.trials
            if t.trial_id in todo and (t.trial_id, r) not in finished
        ]
        self._pool().measure(items)

    def _pool(self) -> LaunchPool:
        if self.pool is None:
            self.pool = LaunchPool(
                self.spec,
                self.plan,
                self.sweep_dir,
                self.record,
                self.emit,
                self.interrupt,
                (self.group, self.across_devices),
            )
        return self.pool

    def close(self) -> None:
        """The sweep has no more work: the rows held from MLflow go to the tracker's thread
        (their writes overlap the launches' end), then its launches end (a row they still
        answer is recorded and held; `Tracker.finish` pushes every row the store lacks)."""
        try:
            self.mirror_held()
        finally:
            if self.pool is not None:
                self.pool.close()

    def calibrate(self) -> None:
        """calibration.json for the report and the step-time model (`platform predict`): the
        all-reduce alpha-beta and the peaks, measured as a work item in the sweep's live launch
        with the most workers (seconds, no worker group of its own), fitted and written into
        the sweep directory; or an earlier sweep's measurement on the same cluster shape,
        reused (driver/calibration_reuse.py) unless `recalibrate`. Kept where the directory
        has one already (a resume, or `platform calibrate`); skipped where no trial
        communicates across devices."""
        from amdahl.driver.calibrate import CPU_MAX_BYTES, GPU_MAX_BYTES, finish_calibration

        target = SweepDir(self.sweep_dir).calibration
        if target.exists() or not any(_communicates(t.settings) for t in self.plan.runnable):
            return
        pool = self._pool()
        launch = pool.calibration_launch(2)
        if launch is None:
            return
        max_bytes = GPU_MAX_BYTES if self.spec.resources.use_gpu else CPU_MAX_BYTES
        key = _calibration_key(self.spec.resources.use_gpu, launch, max_bytes)
        runs_dir = self.sweep_dir.parent
        found = None if self.recalibrate else calibration_reuse.find(runs_dir, key)
        if found is not None:
            self.calibration_reused = found
            self.emit(CalibrationReused(found.sweep_dir, found.age_s()))
            result, reused_from = found.measurement, found.provenance()
        else:
            self.emit(Calibrating(launch.resources.workers))
            started = time.perf_counter()
            result, reused_from = pool.calibrate(2, max_bytes), None
            self.calibration_s += time.perf_counter() - started
            if result is None:
                return
            calibration_reuse.keep(runs_dir, key, copy.deepcopy(result), self.sweep_dir)
        try:
            resources = result.pop("resources_per_worker")
            finish_calibration(self.sweep_dir, result, resources, reused_from=reused_from)
        except Exception as e:  # noqa: BLE001 - the sweep's rows are safe; this is an extra
            logging.getLogger(__name__).warning("calibration.json is incomplete: %s", e)


def continuation(
    spec: SweepSpec, trial_id: str, settings: TrialSettings, repeat: int, rung: int | None
) -> dict[str, Any]:
    """A rung item's `keep` and `continues` (protocol.items.WorkItem; worker/resident.py): with
    `search.continue_rungs`, each ranking rung keeps its trials in their ranks and the next rung
    continues the same repeat of the same configuration, so warmup and set-up are paid once.
    Eager trials only: each trial starts by forgetting what earlier ones compiled
    (worker/training.reset_process_state), so a kept inductor trial would compile again inside
    its window, and a kept TorchScript one failed in backward after another trial's reset
    (tests/unit/worker/test_continuation.py). Not time-to-target (which stops at the target),
    nor the parameter server (its actors would stay up, and closing them is a collective)."""
    if rung is None or not spec.search.continue_rungs or spec.train.target is not None:
        return {}
    ran_before = rung > 0 and repeat < rung_repeats(spec.search, spec.train, rung - 1)
    never = never_continues(settings)
    if never is not None:  # the row says why it started again (its restart_reason)
        own = {"own_compile_caches": True} if settings.compile == "inductor" else {}
        return {**own, "fresh_because": never} if ran_before else own
    earlier = ran_before and ranks_only(spec.search, spec.train, rung - 1)  # and kept it
    return {
        # only a ranking rung's trial: a full one's profiler and communication passes train
        # the model beyond the steps its row counts
        "keep": ranks_only(spec.search, spec.train, rung),
        "continues": item_key(trial_id, repeat, rung - 1) if earlier else None,
    }


def never_continues(settings: TrialSettings) -> str | None:
    """Why a configuration's trial is never kept between rungs (continuation's docstring), as
    its promoted rows' restart_reason says it; None where it can be."""
    if settings.compile != "eager":
        return (
            f"compile {settings.compile} starts fresh each rung: every trial first forgets "
            "what earlier ones compiled, so a kept one would compile again inside its window"
        )
    if settings.sync == "param_server":
        return "sync param_server starts fresh each rung: its server actors would stay up"
    return None


def rung_spec(spec: SweepSpec, rung: int) -> SweepSpec:
    """The spec a search rung runs: `train.steps` (time-to-target: `target.max_steps`) cut to
    the rung's length, and the rung's repeats (search.halving.rung_repeats)."""
    steps = rung_steps(spec.search, spec.train)[rung]
    train = spec.train.model_copy(update={"repeats": rung_repeats(spec.search, spec.train, rung)})
    if train.target is not None:
        target = train.target.model_copy(update={"max_steps": steps})
        train = train.model_copy(update={"target": target})
    else:
        train = train.model_copy(update={"steps": steps})
    return spec.model_copy(update={"train": train})


def _calibration_key(use_gpu: bool, launch: Launch, max_bytes: int) -> dict[str, Any]:
    """The cluster shape a calibration on `launch` measures (calibration_reuse.shape_key)."""
    import torch

    r = launch.resources
    return calibration_reuse.shape_key(
        use_gpu=use_gpu,
        workers=r.workers,
        cpus_per_worker=r.cpus_per_worker,
        gpus_per_worker=r.gpus_per_worker,
        max_bytes=max_bytes,
        nodes=calibration_reuse.cluster_nodes(),
        torch_version=torch.__version__,
    )


def _communicates(settings: TrialSettings) -> bool:
    """Whether a trial moves data between devices (the strategy table's `communicates`)."""
    return settings.devices > 1 and strategies.STRATEGIES[settings.sync].communicates
