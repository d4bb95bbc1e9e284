"""A results row as its child run in the tracking store: the run's key (`child_run_key`), name,
params, metrics, tags and per-step curves, and writing them (`write_child_run`).

Apart from the tracker's mechanism (tracking.json, outage retry, the writer thread,
`track/tracker.py`) because what a row becomes in the store is its own question: which columns
are settings (params; the numeric ones metrics too, since MLflow compares params only as
strings and a filter such as `metrics.devices >= 2` needs a number), which are measurements
(metrics), which are labels (tags: the configuration's label as the report writes it,
`config_labels`), and how the results' `history` column becomes metric history that MLflow
charts against the optimizer step and against time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdahl.analysis.configs import config_options, group_configs
from amdahl.analysis.stats import is_number
from amdahl.columns import AXIS_TABLE, SETTING_COLUMNS
from amdahl.spec.schema import SweepSpec, options_column
from amdahl.track.records import Metric, is_metric_value, now_ms

if TYPE_CHECKING:
    from amdahl.track.mlflow_store import MlflowBackend

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
    "compile_cache",
    "nodes",
)
#: Settings that are numbers, logged as metrics (step 0) as well as params: MLflow compares
#: params as strings, so only a metric filters by value (`metrics.devices >= 2`) and sorts
#: numerically. The axes' come from their table (`columns.Axis.metric`).
NUMERIC_SETTINGS = (
    *(name for name, axis in AXIS_TABLE.items() if axis.metric),
    "global_batch",
    "micro_steps",
    "steps",
    "warmup_steps",
    "torch_threads",
)
#: The row's columns logged as its run's tags (`amdahl.<column>`).
_TAG_COLUMNS = ("status", "host", "device_name", "backend", "flops_source")
#: A child run's configuration, labelled as the report labels it (`d2 b256 fp32 eager w1 ddp`):
#: a configuration's repeats share it, so grouped by it MLflow's runs table aggregates them.
CONFIG_TAG = "amdahl.config"
#: The sweep directory's name (the parent run's name), on the parent and every child.
SWEEP_TAG = "amdahl.sweep"
#: The results' `history` series -> the child run's metric key (step = the optimizer step).
HISTORY_METRICS = {
    "loss": "train/loss",
    "step_time_s": "train/step_time_s",
    "data_wait_s": "train/data_wait_s",
}
#: The results' `utilisation` series -> MLflow system metrics, per rank
#: (`system/rank<k>/<name>`): the run page's System metrics tab charts them.
UTILISATION_METRICS = {
    "cpu_percent": "cpu_utilization_percentage",
    "gpu_percent": "gpu_utilization_percentage",
    "gpu_mib": "gpu_memory_allocated_megabytes",
}


def child_run_key(row: dict[str, Any]) -> str:
    """A row's key in the store (its child run's `amdahl.row` tag) and in tracking.json:
    `trial_id:repeat`, and `:rung<k>` for a search rung (each rung's measurement is a child run
    of its own)."""
    key = f"{row['trial_id']}:{row['repeat']}"
    return key if row.get("rung") is None else f"{key}:rung{row['rung']}"


@dataclass(frozen=True)
class ChildTarget:
    """Where child runs go: the store, the sweep's experiment and parent run, tracking.json's
    record of this store's rows (`logged`), the sweep directory (for a row's traces), and the
    tags every child run carries besides its row's own."""

    store: MlflowBackend
    experiment_id: str
    parent: str
    logged: Mapping[str, Mapping[str, str]]
    sweep_dir: Path | None = None
    tags: Mapping[str, str] | None = None


def write_child_run(
    target: ChildTarget, key: str, row: dict[str, Any], run_id: str | None
) -> tuple[str, bool]:
    """Write row `key` into its child run of the target's parent: `run_id` (tracking.json's
    record of it), else the run the store holds under its key, else a new one. The row's
    profiler traces (its `trace_dir`, under the sweep directory) become the run's files; the
    target's tags go on the run besides the row's own (its configuration, sweep, user and
    source; given at its creation too, so the store records the user).
    Returns the run's id and whether anything was written (not when the store holds the row
    complete already)."""
    store, experiment_id, parent = target.store, target.experiment_id, target.parent
    logged, sweep_dir, tags = target.logged, target.sweep_dir, target.tags
    ok = row["status"] in ("ok", "skipped")  # skipped (search): nothing failed
    existing = None
    if run_id is None:
        # Not in our state: logged before a crash lost the state, or by an earlier record
        # of this store.
        existing = store.find_child(experiment_id, parent, key)
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
        run_id = store.create_child(experiment_id, parent, key, name, dict(tags or {}))
    metrics = _row_metrics(row) + _history_metrics(row) + _utilisation_metrics(row)
    store.log(run_id, metrics, params, {**_row_tags(key, row), **(tags or {})})
    if sweep_dir is not None and row.get("trace_dir"):
        traces = Path(sweep_dir) / str(row["trace_dir"])
        for path in sorted(traces.glob("*")) if traces.is_dir() else ():
            store.log_artifact(run_id, path)
    store.end_run(run_id, "FINISHED" if ok else "FAILED")
    return run_id, True


def config_labels(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each row's configuration label as the report writes it (`analysis.configs.group_configs`
    over `rows`), by the row's key."""
    return {child_run_key(r): c.label for c in group_configs(rows) for r in c.rows}


def config_label_in(row: dict[str, Any], spec: SweepSpec) -> str:
    """`row`'s configuration label as the report will write it once the sweep is done, known as
    the row arrives: the report's own function over the row and, for each axis, `params.` axis
    and `options.` list of the sweep's grid, the row with it at each of its values (a label
    names an optional axis, a workload parameter or an option when the sweep varies it). An
    `exclude` that takes every other value of an axis away, or rows of an earlier spec, can make
    the report's label differ: the tracker puts the report's on the run when the sweep ends
    (`config_labels`)."""
    variants = [row]
    for axis in SETTING_COLUMNS:
        variants += [{**row, axis: v} for v in getattr(spec.grid, axis, ())]
    params = _params(row)
    for name, values in spec.grid.param_axes().items():
        variants += [{**row, "params": json.dumps({**params, name: v})} for v in values]
    options = config_options(row)
    for name, values in spec.grid.option_axes().items():
        if name in options:
            variants += [{**row, "options": options_column({**options, name: v})} for v in values]
    for config in group_configs(variants):
        if any(r is row for r in config.rows):
            return config.label
    return ""  # unreachable: the row is in one configuration


def _params(row: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(row.get("params") or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _run_name(row: dict[str, Any]) -> str:
    """The child run's name in the UI: its settings, like `d2-b256-fp32-eager-ddp-r0`."""
    return (
        f"d{row['devices']}-b{row['batch_size']}-{row['precision']}-{row['compile']}-"
        f"{row['sync']}-r{row['repeat']}"
    ) + (f"-rung{row['rung']}" if row.get("rung") is not None else "")


def _row_params(row: dict[str, Any]) -> dict[str, str]:
    """A row's settings (and its workload's params, `params.<name>`, and the options its
    compile and sync read, `options.<name>`) as its run's params."""
    params = {c: str(row.get(c))[:6000] for c in _PARAM_COLUMNS if row.get(c) is not None}
    for k, v in _params(row).items():
        params[f"params.{k}"] = str(v)[:6000]
    if row.get("sync") is not None:
        for k, v in config_options(row).items():
            params[f"options.{k}"] = str(v)
    return params


def _row_metrics(row: dict[str, Any]) -> list[Metric]:
    """A row's finite numbers that are not settings, and its numeric settings, at step 0,
    stamped with the trial's start (the same each time the row is logged)."""
    stamp = trial_start_ms(row)
    return [
        Metric(k, float(v), stamp, 0)
        for k, v in row.items()
        if (k not in _PARAM_COLUMNS or k in NUMERIC_SETTINGS) and is_metric_value(v)
    ]


def _row_tags(key: str, row: dict[str, Any]) -> dict[str, str]:
    return {
        "amdahl.row": key,
        **{f"amdahl.{c}": str(row.get(c)) for c in _TAG_COLUMNS},
        "amdahl.versions": str(row.get("versions") or ""),
        "amdahl.error": str(row.get("error") or "")[:4000],
    }


def trial_start_ms(row: dict[str, Any]) -> int:
    """The trial's start (`started_at`) in milliseconds since the epoch; now, without one."""
    try:
        return int(datetime.fromisoformat(row["started_at"]).timestamp() * 1000)
    except (TypeError, ValueError, KeyError):
        return now_ms()


def _continued_window_end_s(row: dict[str, Any]) -> float | None:
    """Unix time a continued row's own window closed; None for a row that started fresh."""
    opened, own = row.get("window_opened_unix"), row.get("item_measured_s")
    if not row.get("continued_from") or not is_number(opened) or not is_number(own):
        return None
    return opened + own


def _history_metrics(row: dict[str, Any]) -> list[Metric]:
    """The row's per-step curves (its `history` column) as metrics with step = the optimizer
    step, each stamped when its step ended: the trial's start plus its setup (`setup_s`) plus
    the step's `elapsed_s` from the history, so MLflow's charts against wall or relative time
    spread the points as the trial ran them. A history from before `elapsed_s` was recorded
    stamps every point with the trial's start. The stamps are the same every time the row is
    logged, so a store that already holds a point (a row logged again after a crash) keeps one
    copy."""
    try:
        history = json.loads(row.get("history") or "{}")
    except (TypeError, ValueError):
        return []
    if not isinstance(history, dict):
        return []
    start = trial_start_ms(row)
    steps = history.get("step") or []
    elapsed = history.get("elapsed_s") or []
    setup = row.get("setup_s") if is_number(row.get("setup_s")) else 0.0
    ends = _continued_window_end_s(row)
    if ends is not None and elapsed and is_number(elapsed[-1]):
        # A continued row (search.continue_rungs): its history starts in an earlier rung and
        # its set-up is that item's; its last step ended when this item's window closed.
        start, setup = round(1000 * (ends - elapsed[-1])), 0.0
    stamps = [
        start + round(1000 * (setup + e)) if is_number(e) else start
        for e in (elapsed if len(elapsed) == len(steps) else [None] * len(steps))
    ]
    out = []
    for series, key in HISTORY_METRICS.items():
        values = history.get(series) or []
        for step, value, stamp in zip(steps, values, stamps, strict=False):
            if is_metric_value(value) and isinstance(step, int):
                out.append(Metric(key, float(value), stamp, step))
    return out


def _utilisation_metrics(row: dict[str, Any]) -> list[Metric]:
    """Every rank's utilisation samples (the `utilisation` column) as system metrics, step =
    the sample's index, stamped when it was taken: the trial's start, plus its setup and warmup
    (`setup_s`, `warmup_s`: the measured window opens then), plus the sample's `t`. Like the
    history's, the stamps are the same each time the row is logged."""
    try:
        ranks = json.loads(row.get("utilisation") or "[]")
    except (TypeError, ValueError):
        return []
    if not isinstance(ranks, list):
        return []
    opened = sum(row.get(k) for k in ("setup_s", "warmup_s") if is_number(row.get(k)))
    start = trial_start_ms(row) + round(1000 * opened)
    if _continued_window_end_s(row) is not None:  # no set-up or warmup: its window's samples
        start = round(1000 * row["window_opened_unix"])
    out = []
    for rank, series in enumerate(ranks):
        if not isinstance(series, dict):
            continue
        times = series.get("t") or []
        for column, name in UTILISATION_METRICS.items():
            values = series.get(column) or []
            for i, (t, value) in enumerate(zip(times, values, strict=False)):
                if is_metric_value(value) and is_number(t):
                    stamp = start + round(1000 * t)
                    out.append(Metric(f"system/rank{rank}/{name}", float(value), stamp, i))
    return out
