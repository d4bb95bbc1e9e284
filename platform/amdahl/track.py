"""Mirror the results table to MLflow: a parent run per sweep, a child run per trial repeat.

The driver is the single writer (many processes on one SQLite file contend). Every row is keyed by
`trial_id:repeat` in a tag and in `tracking.json` in the sweep directory, so logging is idempotent:
a resumed sweep or `platform sync` pushes only what MLflow does not have yet. tracking.json keeps
that record per tracking store (its URI without credentials) and experiment, so a sweep directory
copied elsewhere (rsynced down from a cluster) syncs in full to another store.

What MLflow's UI draws from it: each child run carries its trial's per-step curves (the results'
`history` column) as metric history with step = the optimizer step (`HISTORY_METRICS`), logged in
the same batch as the run's other values. The parent run carries the sweep's scaling curves, one
metric history per configuration with step = the device count (`scaling_metrics`), and the best
configuration's figures, logged when the sweep finishes and on `platform sync`. Experiments amdahl
creates, or uses without a kind, are tagged as model training (`EXPERIMENT_KIND`).

An unreachable tracking store never stops a sweep: the rows stay in results.parquet and are pushed
later. Any other tracking failure (a bug, a state file that cannot be written) does not stop it
either, and is reported as one message at its end, never taken for an outage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from amdahl.errors import UserError
from amdahl.files import redact_uris, write_private
from amdahl.results import RESULTS_FILE, SETTING_COLUMNS, read_results
from amdahl.spec import SweepSpec

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
#: tracking.json's layout: 2 keys the record by store; a file without `version` is the old,
#: unkeyed one.
STATE_VERSION = 2
#: After a failed write, rows are kept local for this long before MLflow is tried again.
OFFLINE_RETRY_S = 30.0
#: MLflow settings (read from the environment only) for the sweep's duration: fail fast, and no
#: "View run at <tracking URI>" line per run (a request each; the URI may carry credentials).
_FAIL_FAST_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
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
    "trial_id",
    "launch_id",
    "micro_steps",
    "torch_threads",
)
_TAG_COLUMNS = ("status", "host", "device_name", "backend")
#: MlflowException codes for a store that is unavailable for now (retry later), not a bad request.
_OUTAGE_CODES = frozenset(
    {"TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED"}
)
#: What `get_run` raises for a run id that this store does not hold.
_NO_SUCH_RUN = frozenset({"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "ENDPOINT_NOT_FOUND"})
#: The experiment tag MLflow 3 keeps an experiment's kind in, and the kind of amdahl's: model
#: training, not GenAI. Set on experiments amdahl creates, and on those it uses that have none;
#: a kind already set is never changed.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: The results' `history` series -> the child run's metric key (step = the optimizer step).
HISTORY_METRICS = {
    "loss": "train/loss",
    "step_time_s": "train/step_time_s",
    "data_wait_s": "train/data_wait_s",
}
#: MLflow's limits on one `log_batch` call: metrics, params and tags (each), entities in all.
_BATCH_METRICS, _BATCH_PARAMS_TAGS, _BATCH_ENTITIES = 1000, 100, 1000
#: Characters a metric name may not hold (MLflow allows letters, digits, `_ - . /`, space, and
#: colons except on Windows; `/` is kept for the figure's prefix alone).
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.\- ]+")


def tracking_uri(spec: SweepSpec) -> str | None:
    """MLFLOW_TRACKING_URI, else the sweep file's tracking.uri, else MLflow's own default."""
    return os.environ.get("MLFLOW_TRACKING_URI") or spec.tracking.uri


def store_key(uri: str) -> str:
    """The tracking store `uri` names, as tracking.json records it: without credentials, local
    paths absolute, scheme and host lower-case, no query or trailing slash."""
    if uri.startswith("sqlite:///"):
        path = unquote(uri[len("sqlite:///") :].split("?")[0])
        return "sqlite:///" + (os.path.abspath(path) if path not in ("", ":memory:") else path)
    if uri in ("databricks", "databricks-uc"):
        return uri
    parts = urlsplit(uri)
    if parts.scheme == "file" or ":" not in uri:  # a plain path is MLflow's file store
        return "file://" + os.path.abspath(unquote(parts.path if parts.scheme else uri))
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a port: keep the URI as given, less any password
        return redact_uris(uri)
    return f"{parts.scheme.lower()}://{parts.hostname or ''}{port}{parts.path.rstrip('/')}"


def is_outage(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) means the tracking store cannot be reached
    for now: a refused, reset or timed-out connection, an HTTP error status MLflow gave up
    retrying, a store that answers "unavailable", a locked SQLite file. Anything else (a bad
    request, a bug) is not an outage, and waiting would not fix it."""
    import sqlite3

    import requests
    import sqlalchemy.exc
    import urllib3.exceptions
    from mlflow.exceptions import MlflowException

    network = (
        ConnectionError,
        TimeoutError,
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.RetryError,
        requests.exceptions.ChunkedEncodingError,
        urllib3.exceptions.MaxRetryError,
        urllib3.exceptions.ProtocolError,
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.TimeoutError,
    )
    locked = (sqlite3.OperationalError, sqlalchemy.exc.OperationalError)
    seen: set[int] = set()
    chain: list[BaseException | None] = [error]
    while chain:
        e = chain.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, network):
            return True
        if isinstance(e, MlflowException) and e.error_code in _OUTAGE_CODES:
            return True
        if isinstance(e, locked) and ("locked" in str(e) or "busy" in str(e)):
            return True
        chain += [e.__cause__, e.__context__]
    return False


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
            f"`platform sync {path.parent}`: the file only records which rows MLflow holds, "
            "and without it they are looked up in MLflow by their tags"
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
    """One sweep's MLflow mirror. No tracking failure escapes its methods: an outage is said
    once (`offline_reason`) and retried later; anything else is kept in `error` (or
    `state_error`) and reported by `finish` or `sync` as one message."""

    def __init__(self, spec: SweepSpec, sweep_dir: Path, enabled: bool = True):
        self.spec, self.sweep_dir, self.enabled = spec, Path(sweep_dir), enabled
        self.state_path = self.sweep_dir / STATE_FILE
        self.state: dict[str, Any] = load_state(self.state_path)
        self._uri: str | None = None  # resolved on first use: MLflow's default imports mlflow
        self._store: dict[str, Any] | None = None  # this store's entry in state["stores"]
        self._client: Any = None
        self.offline_reason: str | None = None
        self._offline_until = 0.0
        self.error: str | None = None  # the first tracking failure that is not an outage
        self.state_error: str | None = None  # tracking.json could not be written
        self._pushed = 0  # child runs written, for `sync`'s count
        self._writer: ThreadPoolExecutor | None = None
        self._env_set: list[str] = []  # environment variables this tracker set, to restore
        self._kind_checked = False  # the experiment's kind tag, looked at once per tracker
        if enabled:
            self._fail_fast_http()

    # ---- public ----------------------------------------------------------------------

    def log_trial(self, row: dict[str, Any]) -> bool:
        """Log one results row as a child run (or update it when a retry changed the row).

        Returns False when tracking is off, MLflow is unreachable or the row failed to log.
        """
        if not self.enabled:
            return False
        key = f"{row['trial_id']}:{row['repeat']}"
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
        """Log a row on the tracker's own thread, so MLflow latency never holds up the caller
        (Tune's event loop: a slow callback there lets reported rows pile up, and Ray 2.60's
        function trainable can deadlock flushing them). `finish` waits for these writes."""
        self._submit(self.log_trial, row)

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amdahl-mlflow")
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

    def _push(self, rows: list[dict[str, Any]]) -> int:
        if not self.enabled:
            return 0
        before = self._pushed
        for row in rows:
            self.log_trial(row)
        return self._pushed - before

    def _holds(self, row: dict[str, Any]) -> bool:
        """Whether this store has the row as it is now, by the tracking state."""
        known = self._logged.get(f"{row['trial_id']}:{row['repeat']}")
        return known is not None and known["status"] == row["status"]

    def finish(self, outcome: Any, interrupted: bool = False) -> None:
        """Push what an outage held back, then close the parent run with summary and artifacts."""
        try:
            self._finish(outcome, interrupted)
        finally:
            for name in self._env_set:
                os.environ.pop(name, None)
            self._env_set.clear()

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
            try:
                client, parent = self._ensure_parent()
                client.log_metric(parent, "sweep_wall_s", outcome.wall_s)
                client.log_metric(parent, "trials_failed", len(outcome.failed))
                for name in ("spec.yaml", "plan.json", RESULTS_FILE, "report.md", "report.html"):
                    path = self.sweep_dir / name
                    if path.exists():
                        client.log_artifact(parent, str(path))
                status = "KILLED" if interrupted else "FAILED" if outcome.failed else "FINISHED"
                client.set_terminated(parent, status)
            except Exception as e:  # noqa: BLE001
                self._failed(e, "closing the sweep's parent run")
        self._report_errors(outcome.rows)

    @property
    def parent_run_id(self) -> str | None:
        return self._entry()["parent_run_id"]

    def _all_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The sweep directory's rows (earlier runs' too, when resumed), else `rows`."""
        if not (self.sweep_dir / RESULTS_FILE).exists():
            return rows
        try:
            return read_results(self.sweep_dir).to_pylist()
        except UserError:  # a damaged table: the report says so; these rows are still known
            return rows

    def _log_summary(self, rows: list[dict[str, Any]], with_files: bool = False) -> None:
        """The scaling figures of `rows` on the parent run (and, `with_files`, the report files
        as artifacts). Only figures the parent does not hold yet, by the state, are logged: a
        resumed sweep adds its new points (a point whose value changed, say with more repeats,
        gets a second value at its step: MLflow cannot delete one), a repeated sync nothing."""
        from mlflow.entities import Metric, RunTag

        try:
            metrics, tags = scaling_metrics(rows)
            held = self._entry().get("figures") or {}  # absent until first logged
            new = [(k, v, step) for k, v, step in metrics if held.get(f"{k}@{step}") != v]
            if not new:
                return
            client, parent = self._ensure_parent()
            now = int(time.time() * 1000)
            batch = [Metric(key, value, now, step) for key, value, step in new]
            run_tags = [RunTag(k, v) for k, v in tags.items()]
            for m, _, t in _batches(batch, [], run_tags):
                client.log_batch(parent, metrics=m, tags=t)
            if with_files:
                for name in (RESULTS_FILE, "report.md", "report.html"):
                    path = self.sweep_dir / name
                    if path.exists():
                        client.log_artifact(parent, str(path))
            self._entry()["figures"] = {**held, **{f"{k}@{step}": v for k, v, step in new}}
            self._save_state()
        except Exception as e:  # noqa: BLE001 - the figures can be logged by a later sync
            self._failed(e, "logging the sweep's scaling figures on its parent run")

    # ---- internals ---------------------------------------------------------------------

    def _fail_fast_http(self) -> None:
        """MLflow's HTTP defaults (7 retries, 120 s timeout) would stall the driver for minutes
        per row during an outage; rows are safe locally, so fail fast. MLflow reads these from
        the environment only: they are set here, on the caller's thread before the tracker's
        own thread exists (never from that thread), and `finish` restores the caller's."""
        for name, value in _FAIL_FAST_HTTP.items():
            if name not in os.environ:
                os.environ[name] = value
                self._env_set.append(name)

    def _resolved_uri(self) -> str:
        """MLFLOW_TRACKING_URI, else tracking.uri, else MLflow's default store (which MLflow 3
        makes `sqlite:///mlflow.db` in the working directory)."""
        if self._uri is None:
            uri = tracking_uri(self.spec)
            if not uri:
                import mlflow

                uri = mlflow.get_tracking_uri()
            self._uri = uri
        return self._uri

    def _entry(self) -> dict[str, Any]:
        """This store's record in the tracking state (created empty when new)."""
        if self._store is None:
            key, experiment = store_key(self._resolved_uri()), self.spec.experiment
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

    def _client_or_raise(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            uri = self._resolved_uri()
            if uri.startswith("sqlite:///"):  # the default store too
                create_sqlite_store_atomically(uri)
            self._client = MlflowClient(tracking_uri=uri)
        return self._client

    def _ensure_parent(self) -> tuple[Any, str]:
        client = self._client_or_raise()
        entry = self._entry()
        if entry["parent_run_id"] is None:
            experiment = client.get_experiment_by_name(self.spec.experiment)
            if experiment is None:
                experiment_id = client.create_experiment(
                    self.spec.experiment, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
                )
            else:
                experiment_id = experiment.experiment_id
                self._claim_kind(client, experiment)
            self._kind_checked = True
            earlier = self._earlier_record(client, experiment_id) if experiment else None
            if earlier is not None:
                entry.update(earlier)
                self._save_state()
                return client, entry["parent_run_id"]
            run = client.create_run(
                experiment_id,
                run_name=self.sweep_dir.name,
                tags={"amdahl.sweep_dir": str(self.sweep_dir.resolve()), "amdahl.kind": "sweep"},
            )
            entry["parent_run_id"] = run.info.run_id
            entry["experiment_id"] = experiment_id
            self._save_state()
            for name, value in _flatten(self.spec.model_dump()).items():
                client.log_param(run.info.run_id, name, str(value)[:6000])
            spec_file = self.sweep_dir / "spec.yaml"
            if spec_file.exists():
                client.log_artifact(run.info.run_id, str(spec_file))
        elif not self._kind_checked and entry["experiment_id"] is not None:
            # A parent recorded by an earlier run of the sweep, in an experiment that may
            # predate the kind tag: one look per tracker.
            self._claim_kind(client, client.get_experiment(entry["experiment_id"]))
            self._kind_checked = True
        return client, entry["parent_run_id"]

    def _claim_kind(self, client: Any, experiment: Any) -> None:
        """Tag `experiment` as model training unless it has a kind. The tag only chooses how
        MLflow's UI presents the experiment, so a store that refuses it (a read-only experiment)
        costs nothing else; an outage is raised as usual."""
        if (experiment.tags or {}).get(EXPERIMENT_KIND_TAG):
            return
        try:
            client.set_experiment_tag(
                experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
            )
        except Exception as e:  # noqa: BLE001 - a UI nicety; an outage goes on up
            if is_outage(e):
                raise
            log.debug("could not set %s on the experiment: %s", EXPERIMENT_KIND_TAG, e)

    def _earlier_record(self, client: Any, experiment_id: str) -> dict[str, Any] | None:
        """This sweep's parent run in this store when the state does not record it under this
        store's key: recorded before states were keyed by store (an unknown store), or under
        another URI of the same store; else found by the parent's sweep-directory tag (a state
        file moved aside). Run ids are unique across stores, so a recorded parent this store
        holds means that record's rows are this store's too; `_log_child` looks up the others
        by their row tag before creating any."""
        from mlflow.exceptions import MlflowException

        for other in self.state["stores"]:
            run_id = other["parent_run_id"]
            if other is self._store or run_id is None:
                continue
            try:
                run = client.get_run(run_id)
            except MlflowException as e:
                if e.error_code in _NO_SUCH_RUN:
                    continue
                raise
            if (
                run.info.experiment_id == experiment_id
                and run.info.lifecycle_stage == "active"
                and run.data.tags.get("amdahl.kind") == "sweep"
            ):
                if other["store"] is None:  # the unknown store is this one
                    self.state["stores"] = [e for e in self.state["stores"] if e is not other]
                logged = dict(other["logged"])
                return {"parent_run_id": run_id, "experiment_id": experiment_id, "logged": logged}
        path = str(self.sweep_dir.resolve())
        if "'" in path:
            return None
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`amdahl.sweep_dir` = '{path}' and tags.`amdahl.kind` = 'sweep'",
            max_results=1,
        )
        if not found:
            return None
        return {"parent_run_id": found[0].info.run_id, "experiment_id": experiment_id}

    def _log_child(self, key: str, row: dict[str, Any], run_id: str | None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        client, parent = self._ensure_parent()
        ok = row["status"] == "ok"
        existing = None
        if run_id is None:  # not in our state: logged before a crash lost the state, or by an
            found = client.search_runs(  # earlier record of this store
                [self._entry()["experiment_id"]],
                filter_string=f"tags.`amdahl.row` = '{key}' and "
                f"tags.`mlflow.parentRunId` = '{parent}'",
                max_results=1,
            )
            existing = found[0] if found else None
            run_id = existing.info.run_id if existing else None
            if (
                existing is not None
                and existing.data.tags.get("amdahl.status") == str(row["status"])
                and existing.info.status == ("FINISHED" if ok else "FAILED")
            ):
                return existing.info.run_id  # complete there already
        name = (
            f"d{row['devices']}-b{row['batch_size']}-{row['precision']}-{row['compile']}-"
            f"{row['sync']}-r{row['repeat']}"
        )
        tags = {
            "amdahl.row": key,
            **{f"amdahl.{c}": str(row.get(c)) for c in _TAG_COLUMNS},
            "amdahl.versions": str(row.get("versions") or ""),
            "amdahl.error": str(row.get("error") or "")[:4000],
        }
        metrics = [
            Metric(k, float(v), int(time.time() * 1000), 0)
            for k, v in row.items()
            if isinstance(v, int | float)
            and not isinstance(v, bool)
            and k not in _PARAM_COLUMNS
            and math.isfinite(v)
        ]
        params: list[Any] = []
        if run_id not in self._known_run_ids():
            # New, or found by its tag after a crash that may have come before its params were
            # logged: log them (MLflow accepts a param logged again with the same value).
            params = [Param(c, str(row.get(c))) for c in _PARAM_COLUMNS if row.get(c) is not None]
            params += [
                Param(f"params.{k}", str(v)[:6000])
                for k, v in json.loads(row.get("params") or "{}").items()
            ]
            if existing is not None:  # MLflow refuses a param logged again with a new value
                params = [p for p in params if p.key not in existing.data.params]
        if run_id is None:
            run_id = client.create_run(
                self._entry()["experiment_id"],
                run_name=name,
                tags={"mlflow.parentRunId": parent, "amdahl.row": key},
            ).info.run_id
        metrics += _history_metrics(row)
        for m, p, t in _batches(metrics, params, [RunTag(k, v) for k, v in tags.items()]):
            client.log_batch(run_id, metrics=m, params=p, tags=t)
        client.set_terminated(run_id, "FINISHED" if ok else "FAILED")
        self._pushed += 1
        return run_id

    def _known_run_ids(self) -> set[str]:
        return {entry["run_id"] for entry in self._logged.values()}

    def _failed(self, error: BaseException, doing: str) -> None:
        """An outage waits for the next try; anything else is kept for `_report_errors`."""
        if is_outage(error):
            self._offline(error)
            return
        trace = "".join(traceback.format_exception(error))
        log.debug("MLflow tracking failed %s:\n%s", doing, redact_uris(trace))
        if self.error is None:
            frames = traceback.extract_tb(error.__traceback__)
            where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
            self.error = redact_uris(f"{doing}: {type(error).__name__}: {error}{where}")

    def _report_errors(self, rows: list[dict[str, Any]]) -> None:
        """Say, as one message, what failed other than an outage: a bug (rows left out of
        MLflow) or a tracking.json that could not be written."""
        if self.error is None and self.state_error is None:
            return
        problems = []
        if self.error is not None:
            missing = sum(1 for r in rows if not self._holds(r))
            problems.append(
                f"MLflow tracking failed with an error that is not an outage, so {missing} of "
                f"{len(rows)} rows are not in MLflow: {self.error}"
            )
        if self.state_error is not None:
            problems.append(self.state_error)
        log.error(
            "%s. Every row is in %s; once the cause is fixed, `platform sync %s` pushes what "
            "MLflow lacks (rows it has are found by their tags, not duplicated).",
            "; ".join(problems),
            self.sweep_dir / RESULTS_FILE,
            self.sweep_dir,
        )

    def _offline(self, error: BaseException) -> None:
        self._offline_until = time.monotonic() + OFFLINE_RETRY_S
        if self.offline_reason is None:
            self.offline_reason = redact_uris(f"{type(error).__name__}: {error}")
            log.warning(
                "MLflow unreachable, results stay in %s until `platform sync`: %s",
                self.sweep_dir,
                self.offline_reason,
            )
        self._client = None

    def _save_state(self) -> None:
        """Replace tracking.json. A failure (a full disk) is kept for `_report_errors`, never
        raised into the sweep or lost on the writer thread; a later write that works holds
        everything, and clears it."""
        try:
            write_private(self.state_path, json.dumps(self.state, indent=1))
        except OSError as e:
            self.state_error = (
                f"could not write {self.state_path} ({type(e).__name__}: {e}), so it does not "
                "record every row MLflow now holds"
            )
        else:
            self.state_error = None


def _history_metrics(row: dict[str, Any]) -> list[Any]:
    """The row's per-step curves (its `history` column) as metrics with step = the optimizer
    step. Their timestamp is the trial's start, the same every time the row is logged, so a
    store that already holds a point (a row logged again after a crash) keeps one copy."""
    from datetime import datetime

    from mlflow.entities import Metric

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
    """The parent run's figures, from the report's own numbers (report/compute.py): per scaling
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


def _batches(metrics: list[Any], params: list[Any], tags: list[Any]) -> Any:
    """(metrics, params, tags) for successive `log_batch` calls within MLflow's limits; params
    and tags go first. At least one, if empty."""
    while True:
        p = params[:_BATCH_PARAMS_TAGS]
        t = tags[: _BATCH_PARAMS_TAGS - len(p)]
        m = metrics[: min(_BATCH_METRICS, _BATCH_ENTITIES - len(p) - len(t))]
        params, tags, metrics = params[len(p) :], tags[len(t) :], metrics[len(m) :]
        yield m, p, t
        if not (metrics or params or tags):
            return


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def create_sqlite_store_atomically(uri: str) -> None:
    """Create a new SQLite tracking store under a temporary name and link it into place.

    MLflow builds a new store by running its schema migrations one by one, each committed on its
    own; a driver killed during them (a sweep stopped in its first seconds) leaves a file that
    every later client rejects ("table ... already exists"). Linked into place whole, the store
    either exists complete or not at all. A store that already exists is left alone.
    """
    from urllib.parse import unquote

    from mlflow.tracking import MlflowClient

    path = Path(unquote(uri[len("sqlite:///") :].split("?")[0]))
    if path.exists() or str(path) in ("", ":memory:"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    # From a killed creator: its file, and SQLite's journal when killed inside a transaction.
    for leftover in path.parent.glob(f".{path.name}.*.creating*"):
        pid = leftover.name.split(".")[-2]
        if pid.isdigit() and not _process_alive(int(pid)):
            leftover.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.creating")
    try:
        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
        with contextlib.suppress(FileExistsError):  # another process created it meanwhile
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    return True


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
