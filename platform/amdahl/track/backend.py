"""What the results mirror needs from a tracking store: the interface `track/tracker.py`'s
`Tracker` is written against, so the mechanism (tracking.json's record of what the store holds,
outage retry, the writer thread) is apart from any one store's client. MLflow is its one
implementation (`track/mlflow_store.py`'s `MlflowBackend`), and the unit tests drive the
mechanism through it over real SQLite stores.

The store's model, MLflow's shape: experiments by name; in one, a parent run per sweep and a
child run per results row (its key `trial_id:repeat`); a run holds params (set once), metrics
(a value per step), string tags and files, and ends FINISHED, FAILED or KILLED.

Pure: no MLflow here (docs/architecture.md, "Dependency rules").
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from amdahl.analysis.stats import is_number


class Metric(NamedTuple):
    """One metric value: `key` at `step`, stamped `timestamp` (milliseconds since the epoch)."""

    key: str
    value: float
    timestamp: int
    step: int


def now_ms() -> int:
    """The time now as a `Metric.timestamp`."""
    return int(time.time() * 1000)


def is_metric_value(v: Any) -> bool:
    """Whether `v` can be a `Metric.value`: a finite int or float (not a bool)."""
    return is_number(v)


@dataclass(frozen=True)
class ChildRun:
    """A row's run as the store holds it (found again after tracking.json lost it)."""

    run_id: str
    #: RUNNING while open, else how it ended: FINISHED, FAILED or KILLED.
    status: str
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)


class TrackingBackend(ABC):
    """One tracking store, as the mirror uses it. Every method may raise; an error for which
    `is_outage` is true means "unreachable for now, try later", any other is a failure the
    mirror reports once. The mirror calls these from one thread at a time (the caller's, or its
    writer thread), `begin` and `end` from the caller's only."""

    #: The store's kind, in messages ("MLflow unreachable ...").
    name: str = "tracking"

    def begin(self) -> None:  # noqa: B027 - a hook: most stores need nothing here
        """Before any other call, on the caller's thread (process-wide settings go here)."""

    def end(self) -> None:  # noqa: B027 - a hook: most stores need nothing here
        """After the sweep's last call, on the caller's thread: undo what `begin` set."""

    @property
    @abstractmethod
    def store_key(self) -> str:
        """The store's identity, as tracking.json keys its record (without credentials)."""

    @abstractmethod
    def is_outage(self, error: BaseException) -> bool:
        """Whether `error` means the store cannot be reached for now (waiting may fix it)."""

    @abstractmethod
    def connect(self) -> None:
        """Reach the store, creating it when it is a new local one; a no-op once connected."""

    def disconnect(self) -> None:  # noqa: B027 - a hook: most stores need nothing here
        """After an outage: forget the connection, so the next `connect` makes a new one."""

    @abstractmethod
    def experiment(self, name: str, description: str | None = None) -> tuple[str, bool]:
        """The id of the experiment `name`, created when missing, and whether it existed.
        `description` is given to a new experiment, and to an existing one that has none."""

    def reuse_experiment(self, experiment_id: str) -> None:  # noqa: B027 - a hook
        """An experiment recorded earlier is in use again (called before each write to it)."""

    @abstractmethod
    def is_parent(self, run_id: str, experiment_id: str) -> bool:
        """Whether the store holds `run_id` as a live sweep's parent run in `experiment_id`
        (False when it holds no such run)."""

    @abstractmethod
    def find_parent(self, experiment_id: str, sweep_dir: Path) -> str | None:
        """The parent run that `create_parent` made for `sweep_dir`, if the store holds one."""

    @abstractmethod
    def create_parent(
        self, experiment_id: str, name: str, sweep_dir: Path, tags: Mapping[str, str] | None = None
    ) -> str:
        """A new, open parent run for the sweep in `sweep_dir`, with `tags` from its creation
        (the user among them); its id."""

    @abstractmethod
    def find_child(self, experiment_id: str, parent_id: str, key: str) -> ChildRun | None:
        """The child run of `parent_id` that `create_child` made for row `key`, if any."""

    @abstractmethod
    def create_child(
        self,
        experiment_id: str,
        parent_id: str,
        key: str,
        name: str,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """A new, open child run of `parent_id` for row `key`, with `tags` from its creation;
        its id."""

    @abstractmethod
    def log(
        self,
        run_id: str,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Add metric values, params (a param is set once: the same value again is accepted)
        and tags (a tag set again is replaced) to a run."""

    @abstractmethod
    def log_artifact(self, run_id: str, path: Path) -> None:
        """Attach the file `path` to a run (a file of the same name is replaced)."""

    @abstractmethod
    def end_run(self, run_id: str, status: str) -> None:
        """End a run FINISHED, FAILED or KILLED (a run ended again takes the new status)."""
