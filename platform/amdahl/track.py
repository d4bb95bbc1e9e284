"""Mirror the results table to MLflow: a parent run per sweep, a child run per trial repeat.

The driver is the single writer (many processes on one SQLite file contend). Every row is keyed by
`trial_id:repeat` in a tag and in `tracking.json` in the sweep directory, so logging is idempotent:
a resumed sweep or `platform sync` pushes only what MLflow does not have yet. An unreachable
tracking server never stops a sweep: the rows stay in results.parquet and are pushed later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amdahl.results import SETTING_COLUMNS
from amdahl.spec import SweepSpec

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
#: After a failed write, rows are kept local for this long before MLflow is tried again.
OFFLINE_RETRY_S = 30.0
_FAIL_FAST_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
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


def tracking_uri(spec: SweepSpec) -> str | None:
    """MLFLOW_TRACKING_URI, else the sweep file's tracking.uri, else MLflow's own default."""
    return os.environ.get("MLFLOW_TRACKING_URI") or spec.tracking.uri


class Tracker:
    """One sweep's MLflow mirror. All methods swallow tracking failures (and say so once)."""

    def __init__(self, spec: SweepSpec, sweep_dir: Path, enabled: bool = True):
        self.spec, self.sweep_dir, self.enabled = spec, Path(sweep_dir), enabled
        self.state_path = self.sweep_dir / STATE_FILE
        self.state: dict[str, Any] = (
            json.loads(self.state_path.read_text())
            if self.state_path.exists()
            else {"parent_run_id": None, "logged": {}}
        )
        self._logged: dict[str, dict[str, str]] = self.state["logged"]
        self._client: Any = None
        self.offline_reason: str | None = None
        self._offline_until = 0.0
        self._writer: ThreadPoolExecutor | None = None
        self._env_set: list[str] = []  # environment variables this tracker set, to restore

    # ---- public ----------------------------------------------------------------------

    def log_trial(self, row: dict[str, Any]) -> bool:
        """Log one results row as a child run (or update it when a retry changed the row).

        Returns False when tracking is off or MLflow is unreachable.
        """
        key = f"{row['trial_id']}:{row['repeat']}"
        known = self._logged.get(key)
        if not self.enabled:
            return False
        if known is not None and known["status"] == row["status"]:
            return True
        if self._offline_until > time.monotonic():
            return False  # recently unreachable: do not stall the driver on every row
        try:
            run_id = self._log_child(key, row, known["run_id"] if known else None)
        except Exception as e:  # noqa: BLE001 - a tracking outage must not stop the sweep
            self._offline(e)
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
        self._writer.submit(fn, *args)

    def _open(self) -> None:
        try:
            self._ensure_parent()
        except Exception as e:  # noqa: BLE001 - rows stay local; `finish` tries again
            self._offline(e)

    def sync(self, rows: list[dict[str, Any]]) -> int:
        """Push every row MLflow lacks (or holds in an older state); returns how many."""
        stale = [
            r
            for r in rows
            if self._logged.get(f"{r['trial_id']}:{r['repeat']}", {}).get("status") != r["status"]
        ]
        return sum(1 for r in stale if self.log_trial(r))

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
        self.sync(outcome.rows)
        if self.offline_reason:
            return
        try:
            client, parent = self._ensure_parent()
            client.log_metric(parent, "sweep_wall_s", outcome.wall_s)
            client.log_metric(parent, "trials_failed", len(outcome.failed))
            for name in ("spec.yaml", "plan.json", "results.parquet", "report.md", "report.html"):
                path = self.sweep_dir / name
                if path.exists():
                    client.log_artifact(parent, str(path))
            status = "KILLED" if interrupted else "FAILED" if outcome.failed else "FINISHED"
            client.set_terminated(parent, status)
        except Exception as e:  # noqa: BLE001
            self._offline(e)

    @property
    def parent_run_id(self) -> str | None:
        return self.state["parent_run_id"]

    # ---- internals ---------------------------------------------------------------------

    def _client_or_raise(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            # MLflow's HTTP defaults (7 retries, 120 s timeout) would stall the driver for
            # minutes per row during an outage; rows are safe locally, so fail fast. MLflow
            # reads these from the environment only; `finish` restores the caller's.
            for name, value in _FAIL_FAST_HTTP.items():
                if name not in os.environ:
                    os.environ[name] = value
                    self._env_set.append(name)
            uri = tracking_uri(self.spec)
            if uri and uri.startswith("sqlite:///"):
                create_sqlite_store_atomically(uri)
            self._client = MlflowClient(tracking_uri=uri)
        return self._client

    def _ensure_parent(self) -> tuple[Any, str]:
        client = self._client_or_raise()
        if self.state["parent_run_id"] is None:
            experiment = client.get_experiment_by_name(self.spec.experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment
                else client.create_experiment(self.spec.experiment)
            )
            run = client.create_run(
                experiment_id,
                run_name=self.sweep_dir.name,
                tags={"amdahl.sweep_dir": str(self.sweep_dir.resolve()), "amdahl.kind": "sweep"},
            )
            self.state["parent_run_id"] = run.info.run_id
            self.state["experiment_id"] = experiment_id
            self._save_state()
            for name, value in _flatten(self.spec.model_dump()).items():
                client.log_param(run.info.run_id, name, str(value)[:6000])
            spec_file = self.sweep_dir / "spec.yaml"
            if spec_file.exists():
                client.log_artifact(run.info.run_id, str(spec_file))
        return client, self.state["parent_run_id"]

    def _log_child(self, key: str, row: dict[str, Any], run_id: str | None) -> str:
        from mlflow.entities import Metric, Param, RunTag

        client, parent = self._ensure_parent()
        if run_id is None:  # not in our state: maybe logged just before a crash lost the state
            existing = client.search_runs(
                [self.state["experiment_id"]],
                filter_string=f"tags.`amdahl.row` = '{key}' and "
                f"tags.`mlflow.parentRunId` = '{parent}'",
                max_results=1,
            )
            run_id = existing[0].info.run_id if existing else None
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
        if run_id is None:
            run_id = client.create_run(
                self.state["experiment_id"],
                run_name=name,
                tags={"mlflow.parentRunId": parent, "amdahl.row": key},
            ).info.run_id
        client.log_batch(
            run_id, metrics=metrics, params=params, tags=[RunTag(k, v) for k, v in tags.items()]
        )
        client.set_terminated(run_id, "FINISHED" if row["status"] == "ok" else "FAILED")
        return run_id

    def _known_run_ids(self) -> set[str]:
        return {entry["run_id"] for entry in self._logged.values()}

    def _offline(self, error: Exception) -> None:
        self._offline_until = time.monotonic() + OFFLINE_RETRY_S
        if self.offline_reason is None:
            self.offline_reason = f"{type(error).__name__}: {error}"
            log.warning(
                "MLflow unreachable, results stay in %s until `platform sync`: %s",
                self.sweep_dir,
                self.offline_reason,
            )
        self._client = None

    def _save_state(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.state_path)


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
    for leftover in path.parent.glob(f".{path.name}.*.creating"):  # from a killed creator
        if not _process_alive(int(leftover.name.split(".")[-2])):
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
