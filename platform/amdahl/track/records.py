"""The records the results mirror writes to and reads from its tracking store (MLflow:
track/mlflow_store.py): a metric value (`Metric`) and a child run as the store holds it
(`ChildRun`).

The store's model, MLflow's shape: experiments by name; in one, a parent run per sweep and a
child run per results row (its key `trial_id:repeat`); a run holds params (set once), metrics
(a value per step), string tags and files, and ends FINISHED, FAILED or KILLED.

Pure: no MLflow here (docs/architecture.md, "Dependency rules").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
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
