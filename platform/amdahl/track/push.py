"""Pushing a finished (or stopped) sweep directory's rows to its tracking store afterwards:
`push_results`, what `platform mlflow-push` runs, and its `PushOutcome`.

Apart from the tracker (`track/tracker.py`), which does the pushing, because this is the one
entry that starts from a directory rather than from a running sweep: it reads the spec and the
results table, and holds the directory against a sweep driver meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from amdahl.spec.load import load_spec
from amdahl.sweepdir.layout import existing_sweep_dir
from amdahl.sweepdir.lock import lock_sweep_dir
from amdahl.sweepdir.table import read_results
from amdahl.track.tracker import Tracker
from amdahl.track.ui_link import TrackingLink

#: `lock_sweep_dir`'s `by` for a push (what a driver refused by it is told holds the directory).
PUSH = "MLflow push"


@dataclass(frozen=True)
class PushOutcome:
    """What `push_results` did with a sweep directory's rows.

    `offline_reason`: the store was unreachable (nothing lost: push again when it is back).
    `error`: a failure that is not an outage, or a tracking.json that could not be written
    (every row is still in `results`; push again once the cause is fixed)."""

    results: Path  # the results table the rows were read from
    rows: int  # rows in it
    pushed: int  # rows this push wrote to the store
    offline_reason: str | None = None
    error: str | None = None
    #: Where to look: the link to the runs table (and the `mlflow ui` command for a local
    #: store), when the store holds the sweep's experiment.
    link: TrackingLink | None = None

    @property
    def ok(self) -> bool:
        return self.offline_reason is None and self.error is None

    @property
    def already_there(self) -> int:
        """Rows this push did not write: when `ok`, those the store held already."""
        return self.rows - self.pushed


def push_results(sweep_dir: str | Path) -> PushOutcome:
    """Push to the sweep's tracking store (its spec's `tracking`, MLflow) every row of
    `sweep_dir`'s results table that the store lacks; rows it holds are found by their tags,
    not duplicated (`Tracker.sync`). What `platform mlflow-push` runs.

    Holds the directory (`lock_sweep_dir`) while it reads and pushes: a UserError, naming the
    holder, while a sweep driver writes it (the driver pushes its own rows, and a push beside
    it would replace its tracking.json); a driver started meanwhile is refused. A directory
    without spec.yaml is a UserError too. No tracking failure is raised: it is in
    the outcome (and logged by the tracker on the `amdahl.track.tracker` logger)."""
    d = existing_sweep_dir(sweep_dir)  # before the lock: no lock file in a foreign directory
    spec = load_spec(d.spec)
    advice = (
        "its driver pushes its rows to MLflow itself, and a push beside it would replace its "
        f"{d.tracking.name}. Wait for it to end, or stop it (Ctrl-C in its terminal, or "
        "`kill -INT <pid>` on its host) and push then"
    )
    with lock_sweep_dir(d.path, by=PUSH, advice=advice):
        rows = read_results(d.path).to_pylist()
        tracker = Tracker(spec, d.path)
        try:
            pushed = tracker.sync(rows)
        finally:
            tracker.close()
    problems = [p for p in (tracker.error, tracker.state_error) if p]
    return PushOutcome(
        results=d.results,
        rows=len(rows),
        pushed=pushed,
        offline_reason=tracker.offline_reason,
        error="; ".join(problems) or None,
        link=None if tracker.offline_reason else tracker.link,
    )
