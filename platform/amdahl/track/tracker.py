"""Mirror the results table to a tracking store (MLflow): a parent run per sweep, a child run
per trial repeat.

The mechanism lives here, written against `track_backend.TrackingBackend`; MLflow's client calls
live in track_mlflow.py (`MlflowBackend`, the default store). The driver is the single writer
(many processes on one SQLite file contend). Every row is keyed by `trial_id:repeat` in the store
and in `tracking.json` in the sweep directory, so logging is idempotent: a resumed sweep or
`platform mlflow-push` (`push_results`) pushes only what the store does not have yet.
tracking.json keeps that record per tracking store (`TrackingBackend.store_key`: for MLflow its
URI without credentials) and experiment, so a sweep directory copied elsewhere (rsynced down
from a cluster) is pushed in full to another store.

What MLflow's UI draws from it: each child run carries its trial's per-step curves (the results'
`history` column) as metric history with step = the optimizer step (`HISTORY_METRICS`), logged in
the same batch as the run's other values. The parent run carries the sweep's scaling curves, one
metric history per configuration with step = the device count (`scaling_metrics`), and the best
configuration's figures, logged when the sweep finishes and on `platform mlflow-push`.
Experiments amdahl creates, or uses without a kind, are tagged as model training
(`EXPERIMENT_KIND`).

An unreachable tracking store never stops a sweep: the rows stay in results.parquet and are pushed
later. Any other tracking failure (a bug, a state file that cannot be written) does not stop it
either, and is reported as one message at its end, never taken for an outage.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amdahl.columns import SETTING_COLUMNS
from amdahl.errors import UserError
from amdahl.files import redact_uris, write_private
from amdahl.spec.schema import SweepSpec, load_spec
from amdahl.sweepdir.layout import TRACKING_FILE, SweepDir, existing_sweep_dir, lock_sweep_dir
from amdahl.sweepdir.table import read_results
from amdahl.track.backend import Metric, TrackingBackend
from amdahl.track.mlflow_store import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    MlflowBackend,
    create_sqlite_store_atomically,
    is_outage,
    store_key,
)

#: What callers import from here; the MLflow names are kept importable from this module.
__all__ = [
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "HISTORY_METRICS",
    "STATE_FILE",
    "PushOutcome",
    "Tracker",
    "TrackingBackend",
    "create_sqlite_store_atomically",
    "is_outage",
    "load_state",
    "metric_names",
    "push_results",
    "scaling_metrics",
    "store_key",
]

log = logging.getLogger(__name__)

STATE_FILE = TRACKING_FILE
#: tracking.json's layout: 2 keys the record by store; a file without `version` is the old,
#: unkeyed one.
STATE_VERSION = 2
#: After a failed write, rows are kept local for this long before the store is tried again.
OFFLINE_RETRY_S = 30.0
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
_TAG_COLUMNS = ("status", "host", "device_name", "backend")
#: The results' `history` series -> the child run's metric key (step = the optimizer step).
HISTORY_METRICS = {
    "loss": "train/loss",
    "step_time_s": "train/step_time_s",
    "data_wait_s": "train/data_wait_s",
}
#: Characters a metric name may not hold (MLflow allows letters, digits, `_ - . /`, space, and
#: colons except on Windows; `/` is kept for the figure's prefix alone).
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.\- ]+")


def load_state(path: Path) -> dict[str, Any]:
    """tracking.json: per tracking store and experiment, the parent run, the rows it holds and
    the scaling figures logged on it.

    A file from before the record was keyed by store (no `version`) becomes one entry of an
    unknown store (`store` null), which `Tracker` matches to a store by its parent run id. A
    file that is not a tracking state is a UserError naming the fix.
    """
    if not path.exists():
        return {"version": STATE_VERSION, "stores": []}
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON object expected, got {type(raw).__name__}")
        if "version" in raw:
            if raw["version"] != STATE_VERSION:
                raise ValueError(f"unknown layout version {raw['version']!r}")
            if not isinstance(raw.get("stores"), list):
                raise ValueError("`stores` is not a list")
            stores = raw["stores"]
        else:  # the old, unkeyed layout
            stores = [{"store": None, "experiment": None, **raw}]
        for entry in stores:
            _check_entry(entry)
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise UserError(
            f"{path}: not a readable tracking state ({e}); move it aside and run "
            f"`platform mlflow-push {path.parent}`: the file only records which rows MLflow "
            "holds, and without it they are looked up in MLflow by their tags"
        ) from None
    return {"version": STATE_VERSION, "stores": stores}


def _check_entry(entry: Any) -> None:
    """Raise ValueError unless `entry` is one store's record; fill its optional fields."""
    if not isinstance(entry, dict):
        raise ValueError(f"a store entry is {type(entry).__name__}, not an object")
    for name in ("store", "experiment", "experiment_id", "parent_run_id"):
        if not isinstance(entry.get(name), str | None):
            raise ValueError(f"{name} is {entry[name]!r}, not a string")
    figures = entry.get("figures")
    if figures is not None and not (
        isinstance(figures, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in figures.values())
    ):
        raise ValueError(f"`figures` is {figures!r}, not an object of numbers")
    logged = entry.get("logged")
    if not isinstance(logged, dict):
        raise ValueError(f"`logged` is {type(logged).__name__}, not an object")
    for key, row in logged.items():
        if not (
            isinstance(row, dict)
            and isinstance(row.get("run_id"), str)
            and isinstance(row.get("status"), str)
        ):
            raise ValueError(f"logged row {key!r} is {row!r}, not {{run_id, status}}")
    for name in ("store", "experiment", "experiment_id", "parent_run_id"):
        entry.setdefault(name, None)


class Tracker:
    """One sweep's mirror to a tracking store (`backend`; MLflow unless given). No tracking
    failure escapes its methods: an outage is said once (`offline_reason`) and retried later;
    anything else is kept in `error` (or `state_error`) and reported by `finish` or `sync` as
    one message."""

    def __init__(
        self,
        spec: SweepSpec,
        sweep_dir: Path,
        enabled: bool = True,
        backend: TrackingBackend | None = None,
    ):
        self.spec, self.sweep_dir, self.enabled = spec, Path(sweep_dir), enabled
        self.files = SweepDir(self.sweep_dir)
        self.backend = backend if backend is not None else MlflowBackend(spec.tracking.uri)
        self.state_path = self.files.tracking
        self.state: dict[str, Any] = load_state(self.state_path)
        self._store: dict[str, Any] | None = None  # this store's entry in state["stores"]
        self.offline_reason: str | None = None
        self._offline_until = 0.0
        self.error: str | None = None  # the first tracking failure that is not an outage
        self.state_error: str | None = None  # tracking.json could not be written
        self._pushed = 0  # child runs written, for `sync`'s count
        self._writer: ThreadPoolExecutor | None = None
        if enabled:
            self.backend.begin()  # on the caller's thread, before the writer thread exists

    # ---- public ----------------------------------------------------------------------

    def log_trial(self, row: dict[str, Any]) -> bool:
        """Log one results row as a child run (or update it when a retry changed the row).

        Returns False when tracking is off, the store is unreachable or the row failed to log.
        """
        if not self.enabled:
            return False
        key = _run_key(row)
        try:
            if self._holds(row):
                return True
            if self._offline_until > time.monotonic():
                return False  # recently unreachable: do not stall the driver on every row
            self._ensure_parent()  # may take over an earlier record of this store
            if self._holds(row):
                return True
            known = self._logged.get(key)
            run_id = self._log_child(key, row, known["run_id"] if known else None)
        except Exception as e:  # noqa: BLE001 - no tracking failure stops the sweep
            self._failed(e, f"logging row {key}")
            return False
        self._logged[key] = {"run_id": run_id, "status": row["status"]}
        self._save_state()
        return True

    def open_soon(self) -> None:
        """Connect and create the parent run on the tracker's own thread now, while Ray starts
        the first launch: creating a new SQLite store takes ~3 s of CPU here, which beside the
        first measured trials slowed them (on 2 cores) by up to 25%."""
        if self.enabled:
            self._submit(self._open)

    def log_trial_soon(self, row: dict[str, Any]) -> None:
        """Log a row on the tracker's own thread, so the store's latency never holds up the
        caller (Tune's event loop: a slow callback there lets reported rows pile up, and Ray
        2.60's function trainable can deadlock flushing them). `finish` waits for these
        writes."""
        self._submit(self.log_trial, row)

    def sync(self, rows: list[dict[str, Any]]) -> int:
        """Push every row this store lacks (or holds in an older state), then the scaling
        figures and report files when the parent run lacks these rows' figures; returns how many
        rows were written. A failure that is not an outage is reported (logged) before it
        returns."""
        pushed = self._push(rows)
        if self.enabled and rows and not self.offline_reason:
            self._log_summary(rows, with_files=True)
        self._report_errors(rows)
        return pushed

    def finish(self, outcome: Any, interrupted: bool = False) -> None:
        """Push what an outage held back, then close the parent run with summary and artifacts."""
        try:
            self._finish(outcome, interrupted)
        finally:
            self.close()

    def close(self) -> None:
        """Give the caller's environment back as it was (the backend's settings for the
        tracker's duration); `finish` ends with it."""
        self.backend.end()

    # ---- the writer thread ---------------------------------------------------------------

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amdahl-tracking")
        self._writer.submit(fn, *args).add_done_callback(self._check_done)

    def _check_done(self, future: Future) -> None:
        """Whatever a write on the writer thread raised is kept, not lost with its future."""
        error = None if future.cancelled() else future.exception()
        if error is not None:
            self._failed(error, "writing on the tracker's thread")

    def _open(self) -> None:
        try:
            self._ensure_parent()
        except Exception as e:  # noqa: BLE001 - rows stay local; `finish` tries again
            self._failed(e, "creating the sweep's parent run")

    # ---- rows ----------------------------------------------------------------------------

    def _push(self, rows: list[dict[str, Any]]) -> int:
        if not self.enabled:
            return 0
        before = self._pushed
        for row in rows:
            self.log_trial(row)
        return self._pushed - before

    def _holds(self, row: dict[str, Any]) -> bool:
        """Whether this store has the row as it is now, by the tracking state."""
        known = self._logged.get(_run_key(row))
        return known is not None and known["status"] == row["status"]

    def _log_child(self, key: str, row: dict[str, Any], run_id: str | None) -> str:
        """Write row `key` into its child run (`run_id`, else found by its key, else new)."""
        parent = self._ensure_parent()
        experiment_id = self._entry()["experiment_id"]
        ok = row["status"] in ("ok", "skipped")  # skipped (search): nothing failed
        existing = None
        if run_id is None:
            # Not in our state: logged before a crash lost the state, or by an earlier record
            # of this store.
            existing = self.backend.find_child(experiment_id, parent, key)
            run_id = existing.run_id if existing else None
            if (
                existing is not None
                and existing.tags.get("amdahl.status") == str(row["status"])
                and existing.status == ("FINISHED" if ok else "FAILED")
            ):
                return existing.run_id  # complete there already
        name = (
            f"d{row['devices']}-b{row['batch_size']}-{row['precision']}-{row['compile']}-"
            f"{row['sync']}-r{row['repeat']}"
        ) + (f"-rung{row['rung']}" if row.get("rung") is not None else "")
        params: dict[str, str] = {}
        if run_id not in self._known_run_ids():
            # New, or found by its key after a crash that may have come before its params were
            # logged: log them (a param logged again with the same value is accepted).
            params = _row_params(row)
            if existing is not None:  # a param logged again with a new value is refused
                params = {k: v for k, v in params.items() if k not in existing.params}
        if run_id is None:
            run_id = self.backend.create_child(experiment_id, parent, key, name)
        metrics = _row_metrics(row) + _history_metrics(row)
        self.backend.log(run_id, metrics, params, _row_tags(key, row))
        self.backend.end_run(run_id, "FINISHED" if ok else "FAILED")
        self._pushed += 1
        return run_id

    def _known_run_ids(self) -> set[str]:
        return {entry["run_id"] for entry in self._logged.values()}

    # ---- the parent run ------------------------------------------------------------------

    def _ensure_parent(self) -> str:
        """The sweep's parent run in this store: recorded, taken over from an earlier record,
        or created."""
        self.backend.connect()
        entry = self._entry()
        if entry["parent_run_id"] is None:
            return self._new_parent(entry)
        if entry["experiment_id"] is not None:
            self.backend.reuse_experiment(entry["experiment_id"])
        return entry["parent_run_id"]

    def _new_parent(self, entry: dict[str, Any]) -> str:
        experiment_id, existed = self.backend.experiment(self.spec.experiment)
        earlier = self._earlier_record(experiment_id) if existed else None
        if earlier is not None:
            entry.update(earlier)
            self._save_state()
            return entry["parent_run_id"]
        run_id = self.backend.create_parent(experiment_id, self.sweep_dir.name, self.sweep_dir)
        entry["parent_run_id"] = run_id
        entry["experiment_id"] = experiment_id
        self._save_state()
        params = {k: str(v)[:6000] for k, v in _flatten(self.spec.model_dump()).items()}
        self.backend.log(run_id, params=params)
        if self.files.spec.exists():
            self.backend.log_artifact(run_id, self.files.spec)
        return run_id

    def _earlier_record(self, experiment_id: str) -> dict[str, Any] | None:
        """This sweep's parent run in this store when the state does not record it under this
        store's key: recorded before states were keyed by store (an unknown store), or under
        another URI of the same store; else found by the backend (a state file moved aside).
        Run ids are unique across stores, so a recorded parent this store holds means that
        record's rows are this store's too; `_log_child` looks up the others by their key
        before creating any."""
        for other in self.state["stores"]:
            run_id = other["parent_run_id"]
            if other is self._store or run_id is None:
                continue
            if not self.backend.is_parent(run_id, experiment_id):
                continue
            if other["store"] is None:  # the unknown store is this one
                self.state["stores"] = [e for e in self.state["stores"] if e is not other]
            logged = dict(other["logged"])
            return {"parent_run_id": run_id, "experiment_id": experiment_id, "logged": logged}
        found = self.backend.find_parent(experiment_id, self.sweep_dir)
        if found is None:
            return None
        return {"parent_run_id": found, "experiment_id": experiment_id}

    def _finish(self, outcome: Any, interrupted: bool) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if not self.enabled:
            return
        self._offline_until = 0.0
        self.offline_reason = None
        self._push(outcome.rows)
        if not self.offline_reason:
            self._log_summary(self._all_rows(outcome.rows))
        if not self.offline_reason:
            self._close_parent(outcome, interrupted)
        self._report_errors(outcome.rows)

    def _close_parent(self, outcome: Any, interrupted: bool) -> None:
        """The sweep's totals and files on its parent run, which ends with the sweep's status."""
        try:
            parent = self._ensure_parent()
            now = _now_ms()
            totals = [
                Metric("sweep_wall_s", float(outcome.wall_s), now, 0),
                Metric("trials_failed", float(len(outcome.failed)), now, 0),
            ]
            self.backend.log(parent, totals)
            for path in self.files.mirrored():
                if path.exists():
                    self.backend.log_artifact(parent, path)
            status = "KILLED" if interrupted else "FAILED" if outcome.failed else "FINISHED"
            self.backend.end_run(parent, status)
        except Exception as e:  # noqa: BLE001
            self._failed(e, "closing the sweep's parent run")

    def _all_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The sweep directory's rows (earlier runs' too, when resumed), else `rows`."""
        if not self.files.results.exists():
            return rows
        try:
            return read_results(self.sweep_dir).to_pylist()
        except UserError:  # a damaged table: the report says so; these rows are still known
            return rows

    def _log_summary(self, rows: list[dict[str, Any]], with_files: bool = False) -> None:
        """The scaling figures of `rows` on the parent run (and, `with_files`, the report files
        as artifacts). Only figures the parent does not hold yet, by the state, are logged: a
        resumed sweep adds its new points (a point whose value changed, say with more repeats,
        gets a second value at its step: a store cannot delete one), a repeated sync nothing."""
        try:
            metrics, tags = scaling_metrics(rows)
            held = self._entry().get("figures") or {}  # absent until first logged
            new = [(k, v, step) for k, v, step in metrics if held.get(f"{k}@{step}") != v]
            if not new:
                return
            parent = self._ensure_parent()
            now = _now_ms()
            self.backend.log(parent, [Metric(k, v, now, step) for k, v, step in new], tags=tags)
            if with_files:
                for path in (self.files.results, self.files.report_md, self.files.report_html):
                    if path.exists():
                        self.backend.log_artifact(parent, path)
            self._entry()["figures"] = {**held, **{f"{k}@{step}": v for k, v, step in new}}
            self._save_state()
        except Exception as e:  # noqa: BLE001 - the figures can be logged by a later sync
            self._failed(e, "logging the sweep's scaling figures on its parent run")

    # ---- the tracking state ---------------------------------------------------------------

    def _entry(self) -> dict[str, Any]:
        """This store's record in the tracking state (created empty when new)."""
        if self._store is None:
            key, experiment = self.backend.store_key, self.spec.experiment
            for entry in self.state["stores"]:
                if entry["store"] == key and entry["experiment"] == experiment:
                    self._store = entry
                    break
            else:
                self._store = {
                    "store": key,
                    "experiment": experiment,
                    "experiment_id": None,
                    "parent_run_id": None,
                    "logged": {},
                }
                self.state["stores"].append(self._store)
        return self._store

    @property
    def _logged(self) -> dict[str, dict[str, str]]:
        return self._entry()["logged"]

    def _save_state(self) -> None:
        """Replace tracking.json. A failure (a full disk) is kept for `_report_errors`, never
        raised into the sweep or lost on the writer thread; a later write that works holds
        everything, and clears it."""
        try:
            write_private(self.state_path, json.dumps(self.state, indent=1))
        except OSError as e:
            self.state_error = (
                f"could not write {self.state_path} ({type(e).__name__}: {e}), so it does not "
                f"record every row {self.backend.name} now holds"
            )
        else:
            self.state_error = None

    # ---- failures ------------------------------------------------------------------------

    def _failed(self, error: BaseException, doing: str) -> None:
        """An outage waits for the next try; anything else is kept for `_report_errors`."""
        if self.backend.is_outage(error):
            self._offline(error)
            return
        trace = "".join(traceback.format_exception(error))
        log.debug("%s tracking failed %s:\n%s", self.backend.name, doing, redact_uris(trace))
        if self.error is None:
            frames = traceback.extract_tb(error.__traceback__)
            where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
            self.error = redact_uris(f"{doing}: {type(error).__name__}: {error}{where}")

    def _report_errors(self, rows: list[dict[str, Any]]) -> None:
        """Say, as one message, what failed other than an outage: a bug (rows left out of the
        store) or a tracking.json that could not be written."""
        if self.error is None and self.state_error is None:
            return
        name = self.backend.name
        problems = []
        if self.error is not None:
            missing = sum(1 for r in rows if not self._holds(r))
            problems.append(
                f"{name} tracking failed with an error that is not an outage, so {missing} of "
                f"{len(rows)} rows are not in {name}: {self.error}"
            )
        if self.state_error is not None:
            problems.append(self.state_error)
        log.error(
            "%s. Every row is in %s; once the cause is fixed, `platform mlflow-push %s` pushes "
            "what %s lacks (rows it has are found by their tags, not duplicated).",
            "; ".join(problems),
            self.files.results,
            self.sweep_dir,
            name,
        )

    def _offline(self, error: BaseException) -> None:
        self._offline_until = time.monotonic() + OFFLINE_RETRY_S
        if self.offline_reason is None:
            self.offline_reason = redact_uris(f"{type(error).__name__}: {error}")
            log.warning(
                "%s unreachable, results stay in %s until `platform mlflow-push`: %s",
                self.backend.name,
                self.sweep_dir,
                self.offline_reason,
            )
        self.backend.disconnect()


# --------------------------------------------------------------------------- pushing a sweep

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

    Holds the directory (`sweepdir.lock_sweep_dir`) while it reads and pushes: a UserError,
    naming the holder, while a sweep driver writes it (the driver pushes its own rows, and a
    push beside it would replace its tracking.json); a driver started meanwhile is refused. A
    directory without spec.yaml is a UserError too. No tracking failure is raised: it is in
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
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _run_key(row: dict[str, Any]) -> str:
    """A row's key in the store and in tracking.json: `trial_id:repeat`, and `:rung<k>` for a
    search rung (each rung's measurement is a child run of its own)."""
    key = f"{row['trial_id']}:{row['repeat']}"
    return key if row.get("rung") is None else f"{key}:rung{row['rung']}"


def _row_params(row: dict[str, Any]) -> dict[str, str]:
    """A row's settings (and its workload's params, `params.<name>`) as its run's params."""
    params = {c: str(row.get(c)) for c in _PARAM_COLUMNS if row.get(c) is not None}
    for k, v in json.loads(row.get("params") or "{}").items():
        params[f"params.{k}"] = str(v)[:6000]
    return params


def _row_metrics(row: dict[str, Any]) -> list[Metric]:
    """A row's finite numbers that are not settings, at step 0."""
    now = _now_ms()
    return [
        Metric(k, float(v), now, 0)
        for k, v in row.items()
        if _is_number(v) and k not in _PARAM_COLUMNS and math.isfinite(v)
    ]


def _row_tags(key: str, row: dict[str, Any]) -> dict[str, str]:
    return {
        "amdahl.row": key,
        **{f"amdahl.{c}": str(row.get(c)) for c in _TAG_COLUMNS},
        "amdahl.versions": str(row.get("versions") or ""),
        "amdahl.error": str(row.get("error") or "")[:4000],
    }


def _history_metrics(row: dict[str, Any]) -> list[Any]:
    """The row's per-step curves (its `history` column) as metrics with step = the optimizer
    step. Their timestamp is the trial's start, the same every time the row is logged, so a
    store that already holds a point (a row logged again after a crash) keeps one copy."""
    from datetime import datetime

    try:
        history = json.loads(row.get("history") or "{}")
    except (TypeError, ValueError):
        return []
    if not isinstance(history, dict):
        return []
    try:
        stamp = int(datetime.fromisoformat(row["started_at"]).timestamp() * 1000)
    except (TypeError, ValueError, KeyError):
        stamp = int(time.time() * 1000)
    steps = history.get("step") or []
    out = []
    for series, key in HISTORY_METRICS.items():
        values = history.get(series) or []
        for step, value in zip(steps, values, strict=False):
            if _is_number(value) and math.isfinite(value) and isinstance(step, int):
                out.append(Metric(key, float(value), stamp, step))
    return out


def scaling_metrics(
    rows: list[dict[str, Any]],
) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """The parent run's figures, from the report's own numbers (analysis/compute.py): per scaling
    curve (a configuration: every setting but devices), `throughput/<curve>` (samples/s),
    `speedup/<curve>` and `efficiency/<curve>` at step = the device count, so MLflow charts
    them against devices; and the report's fastest configuration as `best/throughput`,
    `best/devices`, `best/speedup`, `best/efficiency` (step 0), its label in the tag
    `amdahl.best`. `<curve>` is the report's label of the curve (`b256 fp32 eager w1 ddp`), its
    characters MLflow refuses in a name made `_` (`metric_names`).

    Returns ([(key, value, step)], tags); empty when no configuration ran ok."""
    from amdahl.report import report_from_rows

    report = report_from_rows(rows)
    metrics: list[tuple[str, float, int]] = []
    points: dict[tuple, Any] = {}
    names = metric_names([c.label for c in report.curves])
    for curve, name in zip(report.curves, names, strict=True):
        for point in curve.points:
            points[point.config.key] = point
            figures = {
                "throughput": point.config.throughput.median,
                "speedup": point.speedup.median if point.speedup else None,
                "efficiency": point.efficiency,
            }
            metrics += [
                (f"{figure}/{name}", float(value), point.devices)
                for figure, value in figures.items()
                if _is_number(value) and math.isfinite(value)
            ]
    tags: dict[str, str] = {}
    if report.recommendation.picks:
        best = report.recommendation.picks[0].config  # the fastest: the report's first pick
        point = points.get(best.key)
        figures = {
            "throughput": best.throughput.median,
            "devices": best.devices,
            "speedup": point.speedup.median if point and point.speedup else None,
            "efficiency": point.efficiency if point else None,
        }
        metrics += [
            (f"best/{figure}", float(value), 0)
            for figure, value in figures.items()
            if _is_number(value) and math.isfinite(value)
        ]
        tags["amdahl.best"] = best.label
    return metrics, tags


def metric_names(labels: list[str], limit: int = 200) -> list[str]:
    """Each label as the part of a metric name after its figure's `/`: characters MLflow
    refuses (and `/`) become `_`, at most `limit` characters, a `-2`, `-3`... suffix where two
    would be equal."""
    out: list[str] = []
    for label in labels:
        base = _NOT_IN_NAME.sub("_", label).strip()[:limit].strip()
        base = "all" if base in ("", ".", "..") else base  # not a path segment of its own
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
