"""What a sweep tells whoever watches it: one small frozen type per kind of progress, handed to
`run_sweep(on_event=...)` as it happens. The CLI's live view (cli/progress.py) dispatches on the
type; a caller of the Python API can do the same, or ignore what it does not need.

Every event comes on the thread that called `run_sweep`, except `TrackingOpened`, which comes
from the MLflow mirror's own thread once the sweep's parent run exists. Pure: no Ray, torch or
MLflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amdahl.plan.launches import Launch, SweepPlan
    from amdahl.track.ui_link import TrackingLink


@dataclass(frozen=True)
class RayConnected:
    """Ray is up for the sweep: `line` says how (joined, started, or already in this process)
    and what the cluster has."""

    line: str


@dataclass(frozen=True)
class Planned:
    """The plan the sweep runs, in `sweep_dir`; `finished`: the (trial id, repeat) pairs that a
    resumed directory already holds a final row for."""

    plan: SweepPlan
    sweep_dir: Path
    finished: set[tuple[str, int]] = field(default_factory=set)


@dataclass(frozen=True)
class LaunchStarted:
    """A launch's worker group started: its planned shape, whose `trials` it runs."""

    launch: Launch


@dataclass(frozen=True)
class TrialDone:
    """A trial repeat's final results row, as recorded in results.parquet."""

    row: dict[str, Any]


@dataclass(frozen=True)
class RungStarted:
    """search: halving: rung `rung` (of `rungs`) measures `configurations` (trial ids) for
    `steps` steps."""

    rung: int
    rungs: int
    steps: int
    configurations: set[str]


@dataclass(frozen=True)
class Calibrating:
    """The all-reduce and the peaks are being measured on `devices` workers, for the step-time
    model (calibration.json)."""

    devices: int


@dataclass(frozen=True)
class CalibrationReused:
    """An earlier sweep's calibration on the same cluster shape, `age_s` old, was written
    into this sweep's calibration.json instead of measuring (driver/calibration_reuse.py)."""

    sweep_dir: str
    age_s: float


@dataclass(frozen=True)
class SweepFinished:
    """The sweep ended without an interrupt: `outcome` is what `run_sweep` returns (a
    driver.sweep.SweepOutcome)."""

    outcome: Any


@dataclass(frozen=True)
class TrackingOpened:
    """Where MLflow shows the sweep (sent from the MLflow mirror's thread)."""

    link: TrackingLink


SweepEvent = (
    RayConnected
    | Planned
    | LaunchStarted
    | TrialDone
    | RungStarted
    | Calibrating
    | CalibrationReused
    | SweepFinished
    | TrackingOpened
)
#: What `run_sweep(on_event=...)` takes.
EventHandler = Callable[[SweepEvent], None]
