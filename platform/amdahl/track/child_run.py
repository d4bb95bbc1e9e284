"""A results row as its child run in the tracking store: the run's key (`child_run_key`), name,
params, metrics, tags and per-step curves, and writing them (`write_child_run`).

Apart from the tracker's mechanism (tracking.json, outage retry, the writer thread,
`track/tracker.py`) because what a row becomes in the store is its own question: which columns
are settings (params), which are measurements (metrics), which are labels (tags), and how the
results' `history` column becomes metric history MLflow charts against the optimizer step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from amdahl.columns import SETTING_COLUMNS
from amdahl.track.backend import Metric, TrackingBackend, is_metric_value, now_ms

#: The row's columns logged as its run's params (the rest of its numbers are metrics).
_PARAM_COLUMNS = (
    "workload",
    *SETTING_COLUMNS,
    "batch_size",
    "global_batch",
    "scaling",
    "steps",
    "warmup_steps",
    "target",
    "repeat",
    "rung",
    "trial_id",
    "launch_id",
    "micro_steps",
    "torch_threads",
)
#: The row's columns logged as its run's tags (`amdahl.<column>`).
_TAG_COLUMNS = ("status", "host", "device_name", "backend")
#: The results' `history` series -> the child run's metric key (step = the optimizer step).
HISTORY_METRICS = {
    "loss": "train/loss",
    "step_time_s": "train/step_time_s",
    "data_wait_s": "train/data_wait_s",
}


def child_run_key(row: dict[str, Any]) -> str:
    """A row's key in the store (its child run's `amdahl.row` tag) and in tracking.json:
    `trial_id:repeat`, and `:rung<k>` for a search rung (each rung's measurement is a child run
    of its own)."""
    key = f"{row['trial_id']}:{row['repeat']}"
    return key if row.get("rung") is None else f"{key}:rung{row['rung']}"


def write_child_run(
    backend: TrackingBackend,
    experiment_id: str,
    parent: str,
    key: str,
    row: dict[str, Any],
    run_id: str | None,
    logged: Mapping[str, Mapping[str, str]],
) -> tuple[str, bool]:
    """Write row `key` into its child run of `parent`: `run_id` (tracking.json's record of it),
    else the run the store holds under its key, else a new one. `logged` is tracking.json's
    record of this store's rows. Returns the run's id and whether anything was written (not
    when the store holds the row complete already)."""
    ok = row["status"] in ("ok", "skipped")  # skipped (search): nothing failed
    existing = None
    if run_id is None:
        # Not in our state: logged before a crash lost the state, or by an earlier record
        # of this store.
        existing = backend.find_child(experiment_id, parent, key)
        run_id = existing.run_id if existing else None
        if (
            existing is not None
            and existing.tags.get("amdahl.status") == str(row["status"])
            and existing.status == ("FINISHED" if ok else "FAILED")
        ):
            return existing.run_id, False  # complete there already
    name = _run_name(row)
    params: dict[str, str] = {}
    if run_id not in {entry["run_id"] for entry in logged.values()}:
        # New, or found by its key after a crash that may have come before its params were
        # logged: log them (a param logged again with the same value is accepted).
        params = _row_params(row)
        if existing is not None:  # a param logged again with a new value is refused
            params = {k: v for k, v in params.items() if k not in existing.params}
    if run_id is None:
        run_id = backend.create_child(experiment_id, parent, key, name)
    metrics = _row_metrics(row) + _history_metrics(row)
    backend.log(run_id, metrics, params, _row_tags(key, row))
    backend.end_run(run_id, "FINISHED" if ok else "FAILED")
    return run_id, True


def _run_name(row: dict[str, Any]) -> str:
    """The child run's name in the UI: its settings, like `d2-b256-fp32-eager-ddp-r0`."""
    return (
        f"d{row['devices']}-b{row['batch_size']}-{row['precision']}-{row['compile']}-"
        f"{row['sync']}-r{row['repeat']}"
    ) + (f"-rung{row['rung']}" if row.get("rung") is not None else "")


def _row_params(row: dict[str, Any]) -> dict[str, str]:
    """A row's settings (and its workload's params, `params.<name>`) as its run's params."""
    params = {c: str(row.get(c)) for c in _PARAM_COLUMNS if row.get(c) is not None}
    for k, v in json.loads(row.get("params") or "{}").items():
        params[f"params.{k}"] = str(v)[:6000]
    return params


def _row_metrics(row: dict[str, Any]) -> list[Metric]:
    """A row's finite numbers that are not settings, at step 0."""
    now = now_ms()
    return [
        Metric(k, float(v), now, 0)
        for k, v in row.items()
        if k not in _PARAM_COLUMNS and is_metric_value(v)
    ]


def _row_tags(key: str, row: dict[str, Any]) -> dict[str, str]:
    return {
        "amdahl.row": key,
        **{f"amdahl.{c}": str(row.get(c)) for c in _TAG_COLUMNS},
        "amdahl.versions": str(row.get("versions") or ""),
        "amdahl.error": str(row.get("error") or "")[:4000],
    }


def _history_metrics(row: dict[str, Any]) -> list[Metric]:
    """The row's per-step curves (its `history` column) as metrics with step = the optimizer
    step. Their timestamp is the trial's start, the same every time the row is logged, so a
    store that already holds a point (a row logged again after a crash) keeps one copy."""
    try:
        history = json.loads(row.get("history") or "{}")
    except (TypeError, ValueError):
        return []
    if not isinstance(history, dict):
        return []
    try:
        stamp = int(datetime.fromisoformat(row["started_at"]).timestamp() * 1000)
    except (TypeError, ValueError, KeyError):
        stamp = now_ms()
    steps = history.get("step") or []
    out = []
    for series, key in HISTORY_METRICS.items():
        values = history.get(series) or []
        for step, value in zip(steps, values, strict=False):
            if is_metric_value(value) and isinstance(step, int):
                out.append(Metric(key, float(value), stamp, step))
    return out
