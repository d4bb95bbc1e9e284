"""One sweep's directory (`runs/<name>-<UTC stamp>/`): the name of every file in it, their
paths (`SweepDir`), and the naming of a new directory (`new_sweep_dir`) or the newest of a sweep
(`latest_sweep_dir`, for `--resume` without a directory).

The bottom of sweepdir/: the driver, the report, the MLflow mirror and calibrate all find a
sweep's files through these names, so the layout is defined once (docs/architecture.md,
"A sweep directory"). Of amdahl it imports only errors and files, so every other module,
in sweepdir/ and outside it, can import it without a cycle. The lock, the resume checks, the
driver's files and the results table are the other modules of sweepdir/.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from amdahl.errors import UserError
from amdahl.files import private_dir

SPEC_FILE = "spec.yaml"
PLAN_FILE = "plan.json"
RESULTS_FILE = "results.parquet"
REPORT_MD_FILE = "report.md"
REPORT_HTML_FILE = "report.html"
#: The report's recommended configuration as a sweep file that runs as written (report/best.py).
BEST_FILE = "best.yaml"
CALIBRATION_FILE = "calibration.json"
TRACKING_FILE = "tracking.json"
#: Held (flock) by the process writing a sweep directory (its driver, or a push to MLflow) for
#: as long as it writes; it names that process (pid, host, start) for the next one that tries.
LOCK_FILE = "driver.lock"
#: The settings a sweep directory's rows were measured under, and their hash.
FINGERPRINT_FILE = "fingerprint.json"
RAY_LOG_FILE = "ray.log"
#: Ray Tune's and Train's state on the driver's disk, when the spec names no shared `storage`.
RAY_DIR = "ray"
#: The profiler pass's per-rank Chrome traces: `traces/<trial id>/<repeat>[-rung<k>]/`.
TRACES_DIR = "traces"


@dataclass(frozen=True)
class SweepDir:
    """Paths of one sweep directory's files."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def spec(self) -> Path:
        return self.path / SPEC_FILE

    @property
    def plan(self) -> Path:
        return self.path / PLAN_FILE

    @property
    def results(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def report_md(self) -> Path:
        return self.path / REPORT_MD_FILE

    @property
    def report_html(self) -> Path:
        return self.path / REPORT_HTML_FILE

    @property
    def best(self) -> Path:
        return self.path / BEST_FILE

    @property
    def calibration(self) -> Path:
        return self.path / CALIBRATION_FILE

    @property
    def tracking(self) -> Path:
        return self.path / TRACKING_FILE

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def fingerprint(self) -> Path:
        return self.path / FINGERPRINT_FILE

    @property
    def ray_log(self) -> Path:
        return self.path / RAY_LOG_FILE

    @property
    def ray_dir(self) -> Path:
        return self.path / RAY_DIR

    def trace_dir(self, trial_id: str, repeat: int, rung: int | None) -> Path:
        """The folder of one row's traces (one row: trial id, repeat, rung)."""
        run = f"{repeat}" if rung is None else f"{repeat}-rung{rung}"
        return self.path / TRACES_DIR / trial_id / run

    @staticmethod
    def trace_file(rank: int) -> str:
        """One rank's trace in a trace folder: gzip-compressed Chrome trace JSON (the
        `.pt.trace.json.gz` name TensorBoard's profiler plugin and Perfetto open as is)."""
        return f"rank{rank}.pt.trace.json.gz"

    def mirrored(self) -> tuple[Path, ...]:
        """The files the MLflow mirror uploads as the parent run's artifacts."""
        return (self.spec, self.plan, self.results, self.report_md, self.report_html)


def existing_sweep_dir(sweep_dir: str | Path) -> SweepDir:
    """A directory `platform sweep` wrote (it holds spec.yaml), else one UserError."""
    d = SweepDir(sweep_dir)
    if not d.spec.is_file():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (no {SPEC_FILE} in it); pass a directory "
            "made by `platform sweep`"
        )
    return d


# --------------------------------------------------------------------------- naming

#: The UTC time in a sweep directory's name, `<name>-<stamp>` (then `-2`, `-3`... when several
#: sweeps of one name start in the same second).
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_STAMP = r"\d{8}T\d{6}Z(?:-\d+)?"


def new_sweep_dir(runs_dir: Path, name: str) -> Path:
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


def latest_sweep_dir(runs_dir: str | Path, name: str) -> Path:
    """The newest `runs/<name>-<UTC time>` directory, for `--resume` without a directory: the
    name must match exactly, so sweep `scaling` never picks `scaling-big-<UTC time>`. Newest
    is the last written to; a directory whose driver still runs is picked, then refused by
    its lock (`lock_sweep_dir`, sweepdir/lock.py)."""
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
