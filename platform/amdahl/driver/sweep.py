"""A whole sweep, from the spec to the closing: `run_sweep`.

Its lifecycle: the search section checked (before any directory is made), the sweep directory
opened and locked (new, or resumed: sweepdir.resume), the workload located and Ray started or
joined with its code (driver.cluster), the workload's data path checked (driver.planning) and
the plan made for the nodes Ray has (plan.launches), then the trials measured under
Ctrl-C/SIGTERM handling (driver.signals): all of a grid sweep at once (driver.measurement), or a
halving search's rungs one after another (driver.rungs). However it ends, the report is
written and the MLflow parent run closed. The driver is the only writer of results.parquet and
MLflow (driver/pool.py brings the rows here, from the work queue).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdahl.driver.cluster import cluster_address, cluster_summary, connect_ray, ray_nodes
from amdahl.driver.events import (
    EventHandler,
    Planned,
    RayConnected,
    SweepEvent,
    SweepFinished,
    TrackingOpened,
)
from amdahl.driver.measurement import Measurement
from amdahl.driver.planning import check_workloads, workload_facts
from amdahl.driver.rungs import run_halving
from amdahl.driver.signals import InterruptFlag, SweepInterrupted
from amdahl.errors import UserError
from amdahl.plan.launches import SweepPlan, plan_sweep
from amdahl.search.halving import SearchState
from amdahl.search.spec_checks import check_search
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.driver_files import write_sweep_files
from amdahl.sweepdir.layout import SweepDir
from amdahl.sweepdir.resume import open_sweep_dir
from amdahl.sweepdir.table import read_results
from amdahl.track.ui_link import TrackingLink
from amdahl.workload.code import locate_spec_workload

if TYPE_CHECKING:
    from amdahl.report.build import Report


@dataclass
class SweepOutcome:
    """What `run_sweep` returns: the plan, the rows recorded this session and where."""

    sweep_dir: Path
    plan: SweepPlan
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    #: search: halving: where the search ended, else None.
    search: SearchState | None = None
    #: Ray Train worker groups started (a restart after a worker died counts).
    group_starts: int = 0
    #: Why each worker group started, in order (driver.pool.LaunchPool.start_reasons).
    group_start_reasons: list[str] = field(default_factory=list)
    #: Wall seconds spent measuring the all-reduce calibration inside the sweep's groups.
    calibration_s: float = 0.0
    #: The sweep directory whose calibration this one reused (same cluster shape), if any.
    calibration_reused_from: str | None = None
    #: Seconds from `run_sweep`'s call to the first measured step (the first row's window
    #: opening: Ray's start, planning, data and the worker group's start before it).
    first_measured_s: float | None = None
    #: Where to look in MLflow (the runs table's link; for a local store the `mlflow ui`
    #: command), None when tracking is off or the store was unreachable at the end.
    tracking: TrackingLink | None = None

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") != "ok"]


#: run_sweep's `worker_groups`: (group a launch's trials, share a group across device counts).
WORKER_GROUPS = {
    "per_shape": (True, True),
    "per_device_count": (True, False),
    "per_trial": (False, True),
}


def run_sweep(  # noqa: PLR0913 - public API: keyword-only options (README)
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
    worker_groups: str = "per_shape",
    recalibrate: bool = False,
) -> SweepOutcome:
    """Plan, launch and record a whole sweep; returns what was run and where it was written.

    Uses the Ray already initialised in this process if any, else connects to `address`, else
    joins the Ray cluster running here (as `ray.init()` would find it: RAY_ADDRESS, or the
    cluster `ray start` / `ray up` started on this node), else starts a local Ray sized to this
    machine; `address="local"` always starts a private local one. With `resume` (a sweep
    directory), only trial repeats without a final row there run (failed ones too with
    `retry_failed`); a resume whose measurement settings differ from the directory's is refused
    (see `sweepdir.resume.spec_changes`), or with `new_if_changed` starts a new directory.
    The sweep directory is locked for the whole run (`sweepdir.lock.lock_sweep_dir`): a second
    driver there is refused.
    `worker_groups`: "per_shape" (one per worker-group shape, serving every device count it
    holds), or, for overhead comparisons, "per_device_count" or "per_trial" (WORKER_GROUPS).
    `recalibrate` measures the closing calibration even where an earlier sweep in `runs_dir`
    measured one on the same cluster shape within a day (driver/calibration_reuse.py).
    `on_event(event)` hears the sweep's progress (driver.events: a type per kind) on the
    calling thread, except `TrackingOpened` (where MLflow shows the sweep), which comes from
    the MLflow mirror's own thread once the sweep's parent run exists.
    Raises SweepInterrupted after a first Ctrl-C or SIGTERM has stopped it cleanly.
    """
    if worker_groups not in WORKER_GROUPS:
        raise ValueError(f"worker_groups: {worker_groups!r}, not one of {sorted(WORKER_GROUPS)}")
    check_search(spec)  # pure: a search section that cannot run creates no directory
    runs_dir = Path(runs_dir)
    fresh_runs_dir = not runs_dir.exists()
    sweep_dir, finished, lock, created = open_sweep_dir(
        spec, runs_dir, resume, retry_failed, new_if_changed
    )
    try:
        options = _DriverOptions(address, on_event, verbose, tracking, worker_groups, recalibrate)
        return _run_locked(spec, sweep_dir, finished, created, options)
    except BaseException:
        if fresh_runs_dir and not sweep_dir.exists():  # planning failed: leave no trace
            with contextlib.suppress(OSError):
                runs_dir.rmdir()
        raise
    finally:
        lock.release()


@dataclass(frozen=True)
class _DriverOptions:
    """`run_sweep`'s options that reach past opening the sweep directory (see run_sweep)."""

    address: str | None
    on_event: EventHandler | None
    verbose: bool
    tracking: bool | None
    worker_groups: str
    recalibrate: bool


def _run_locked(
    spec: SweepSpec,
    sweep_dir: Path,
    finished: set[tuple[str, int]],
    created: bool,
    options: _DriverOptions,
) -> SweepOutcome:
    """`run_sweep` in a directory this driver holds (`created`: made by it, removed again if
    planning fails)."""
    address, verbose, tracking = options.address, options.verbose, options.tracking
    emit = options.on_event or _ignore
    started, started_unix = time.perf_counter(), time.time()
    try:
        code = locate_spec_workload(spec)  # an import error costs no Ray start
        # A cluster running here (after `ray up` and `ray attach`, or `ray start`) is joined,
        # as ray.init() would; address "local" starts a private one instead (the rule
        # `platform plan` plans by).
        address = cluster_address(address)
        fresh = connect_ray(address, SweepDir(sweep_dir).ray_log, verbose, code.runtime_env())
        how = "joined" if address and fresh else "started" if fresh else "in this process:"
        emit(RayConnected(f"Ray: {how} {cluster_summary()}"))
        check_workloads(spec)  # the search section and the workload's import: checked above
        plan = plan_sweep(spec, ray_nodes(), workload_facts(spec))
        if not plan.runnable:
            raise UserError(_nothing_runs(plan))
    except BaseException:
        if created:
            shutil.rmtree(sweep_dir, ignore_errors=True)  # never leave a half-made sweep
        raise
    write_sweep_files(sweep_dir, spec, plan)  # as given: a resume compares with that
    spec = plan.spec  # with `resources: auto` chosen (plan.auto_resources)
    emit(Planned(plan, sweep_dir, finished))

    tracker = _tracker(spec, sweep_dir, tracking, emit)
    tracker.sync(read_results(sweep_dir).to_pylist())  # rows an outage kept from MLflow
    tracker.open_soon()
    outcome = SweepOutcome(sweep_dir=sweep_dir, plan=plan)
    interrupt = InterruptFlag()
    measurement = Measurement(
        spec,
        plan,
        sweep_dir,
        outcome.rows,
        tracker,
        emit,
        interrupt,
        *WORKER_GROUPS[options.worker_groups],
        recalibrate=options.recalibrate,
    )
    try:
        with interrupt.installed():
            if spec.search.method == "halving":
                outcome.search = run_halving(measurement)
            else:
                measurement.measure({t.trial_id for t in plan.runnable}, finished)
            if not interrupt.is_set():
                measurement.calibrate()  # in the group that is up: `platform predict` works as is
    finally:
        measurement.close()  # MLflow's held writes begin, every launch ends
        outcome.wall_s = time.perf_counter() - started
        _note_measurement(outcome, measurement, started_unix)
        report = _write_report(sweep_dir)
        tracker.finish(outcome, interrupted=interrupt.is_set(), report=report)
        outcome.tracking = None if tracker.offline_reason else tracker.link
    if interrupt.is_set():
        raise SweepInterrupted(sweep_dir, interrupt.signum or signal.SIGINT)
    emit(SweepFinished(outcome))
    return outcome


def _note_measurement(outcome: SweepOutcome, measurement: Measurement, started_unix: float) -> None:
    """What the closing summary says of the launches and the calibration."""
    if measurement.pool is not None:
        outcome.group_starts = measurement.pool.group_starts()
        outcome.group_start_reasons = [why for _, why in measurement.pool.start_reasons]
        opened = measurement.pool.first_window_unix
        outcome.first_measured_s = opened - started_unix if opened else None
    outcome.calibration_s = measurement.calibration_s
    if measurement.calibration_reused is not None:
        outcome.calibration_reused_from = measurement.calibration_reused.sweep_dir


def _tracker(spec: SweepSpec, sweep_dir: Path, tracking: bool | None, emit: EventHandler) -> Any:
    """The sweep's MLflow mirror. Where MLflow shows the sweep is emitted from the tracker's own
    thread once the parent run exists (`TrackingOpened`: the one event not sent from this one)."""
    from amdahl.track.tracker import Tracker

    return Tracker(
        spec,
        sweep_dir,
        enabled=spec.tracking.enabled if tracking is None else tracking,
        on_open=lambda link: emit(TrackingOpened(link)),
    )


def _ignore(event: SweepEvent) -> None:
    """The event handler when the caller gives none."""


def _write_report(sweep_dir: Path) -> Report | None:
    """report.md and report.html from results.parquet, and the report (which the MLflow
    mirror describes the parent run with); a report bug never costs the sweep."""
    from amdahl.report import build_report, write_reports

    try:
        report = build_report(sweep_dir)
        write_reports(sweep_dir, report)
    except Exception as e:  # noqa: BLE001 - the rows are safe; `platform report` can retry
        logging.getLogger(__name__).warning("could not write the report for %s: %s", sweep_dir, e)
        return None
    return report


def _nothing_runs(plan: SweepPlan) -> str:
    lines = ["no trial of this sweep can run here:"]
    lines += [f"  {plan.labels[t.trial_id]}: {t.refused}" for t in plan.refused[:10]]
    if len(plan.refused) > 10:
        lines.append(f"  ... and {len(plan.refused) - 10} more")
    return "\n".join(lines)
