"""MLflow as the results mirror's tracking store: `MlflowBackend`, the store as `Tracker`
(track/tracker.py) uses it, through `MlflowClient`; and what only MLflow needs: which of its
errors are an outage, the store's key for tracking.json, fail-fast HTTP settings, its batch
limits, the experiment-kind tag and description, and creating a new SQLite store atomically.

MLflow is imported inside functions only: importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from amdahl.files import redact_uris
from amdahl.track.records import ChildRun, Metric

#: Messages go where the mirror's do (one logger for what tracking says).
log = logging.getLogger("amdahl.track.tracker")

#: MLflow settings (read from the environment only) for the sweep's duration: fail fast, and no
#: "View run at <tracking URI>" line per run (a request each; the URI may carry credentials).
FAIL_FAST_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
#: MlflowException codes for a store that is unavailable for now (retry later), not a bad request.
_OUTAGE_CODES = frozenset(
    {"TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED"}
)
#: What `get_run` raises for a run id that this store does not hold.
_NO_SUCH_RUN = frozenset({"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "ENDPOINT_NOT_FOUND"})
#: The experiment tag MLflow 3 keeps an experiment's kind in, and the kind of amdahl's: model
#: training, not GenAI. Set on experiments amdahl creates, and on those it uses that have none;
#: a kind already set is never changed. It labels the experiment for what reads the tag; it does
#: not choose the view MLflow's UI opens: MLflow 3.17's UI picks GenAI or model training only
#: from the link's `?workflowType=machine_learning` or the browser's saved switch.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: MLflow's limits on one `log_batch` call: metrics, params and tags (each), entities in all.
_BATCH_METRICS, _BATCH_PARAMS_TAGS, _BATCH_ENTITIES = 1000, 100, 1000
#: The tag MLflow's UI shows (and edits) as an experiment's or a run's description (Markdown).
NOTE_TAG = "mlflow.note.content"
#: The tag holding a child run's key (`child_run_key`: `trial_id:repeat`), which `find_child`
#: searches.
_ROW_TAG = "amdahl.row"


def tracking_uri(configured: str | None) -> str | None:
    """MLFLOW_TRACKING_URI, else the sweep file's tracking.uri (`configured`), else None."""
    return os.environ.get("MLFLOW_TRACKING_URI") or configured


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


class MlflowBackend:
    """An MLflow tracking store through `MlflowClient`: MLFLOW_TRACKING_URI, else the sweep
    file's tracking.uri (`configured_uri`), else MLflow's default store.

    Every method may raise; an error for which `is_outage` is true means "unreachable for now,
    try later", any other is a failure the mirror reports once. The mirror calls these from one
    thread at a time (the caller's, or its writer thread), `begin` and `end` from the caller's
    only."""

    name = "MLflow"

    def __init__(self, configured_uri: str | None = None):
        self.configured_uri = configured_uri
        self._uri: str | None = None  # resolved on first use: MLflow's default imports mlflow
        self._client: Any = None
        self._env_set: list[str] = []  # environment variables `begin` set, for `end` to undo
        self._kind_checked = False  # the experiment's kind tag, looked at once per backend

    # ---- the store and its settings ------------------------------------------------------

    @property
    def uri(self) -> str:
        """MLFLOW_TRACKING_URI, else tracking.uri, else MLflow's default store (which MLflow 3
        makes `sqlite:///mlflow.db` in the working directory)."""
        if self._uri is None:
            uri = tracking_uri(self.configured_uri)
            if not uri:
                import mlflow

                uri = mlflow.get_tracking_uri()
            self._uri = uri
        return self._uri

    @property
    def store_key(self) -> str:
        """The store's identity, as tracking.json keys its record (without credentials)."""
        return store_key(self.uri)

    def is_outage(self, error: BaseException) -> bool:
        """Whether `error` means the store cannot be reached for now (waiting may fix it)."""
        return is_outage(error)

    def begin(self) -> None:
        """MLflow's HTTP defaults (7 retries, 120 s timeout) would stall the driver for minutes
        per row during an outage; rows are safe locally, so fail fast. MLflow reads these from
        the environment only: they are set here, on the caller's thread before the tracker's
        own thread exists (never from that thread), and `end` restores the caller's."""
        for name, value in FAIL_FAST_HTTP.items():
            if name not in os.environ:
                os.environ[name] = value
                self._env_set.append(name)

    def end(self) -> None:
        """After the sweep's last call, on the caller's thread: undo what `begin` set."""
        for name in self._env_set:
            os.environ.pop(name, None)
        self._env_set.clear()

    def connect(self) -> None:
        """Reach the store, creating it when it is a new local one; a no-op once connected."""
        self._connected()

    def disconnect(self) -> None:
        """After an outage: forget the connection, so the next `connect` makes a new one."""
        self._client = None

    def _connected(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            uri = self.uri
            if uri.startswith("sqlite:///"):  # the default store too
                create_sqlite_store_atomically(uri)
            self._client = MlflowClient(tracking_uri=uri)
        return self._client

    # ---- experiments ---------------------------------------------------------------------

    def experiment(self, name: str, description: str | None = None) -> tuple[str, bool]:
        """The id of the experiment `name`, created when missing, and whether it existed.
        `description` is given to a new experiment, and to an existing one that has none."""
        client = self._connected()
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            if description:
                tags[NOTE_TAG] = description
            found = client.create_experiment(name, tags=tags)
        else:
            self._claim_kind(experiment)
            if description and not (experiment.tags or {}).get(NOTE_TAG):
                self._label(experiment.experiment_id, NOTE_TAG, description)
            found = experiment.experiment_id
        self._kind_checked = True
        return found, experiment is not None

    def reuse_experiment(self, experiment_id: str) -> None:
        """A parent recorded by an earlier run of the sweep, in an experiment that may predate
        the kind tag: one look per backend."""
        if not self._kind_checked:
            self._claim_kind(self._connected().get_experiment(experiment_id))
            self._kind_checked = True

    def _claim_kind(self, experiment: Any) -> None:
        """Tag `experiment` as model training unless it has a kind. The tag is a label (MLflow
        3.17's UI does not take its view from it), so a store that refuses it (a read-only
        experiment) costs nothing else; an outage is raised as usual."""
        if (experiment.tags or {}).get(EXPERIMENT_KIND_TAG):
            return
        self._label(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)

    def _label(self, experiment_id: str, key: str, value: str) -> None:
        """Set an experiment tag that only labels it (its kind, its description): a store that
        refuses it (a read-only experiment) costs nothing else; an outage is raised as usual."""
        try:
            self._connected().set_experiment_tag(experiment_id, key, value)
        except Exception as e:  # noqa: BLE001 - a label; an outage goes on up
            if is_outage(e):
                raise
            log.debug("could not set %s on the experiment: %s", key, e)

    # ---- runs ----------------------------------------------------------------------------

    def is_parent(self, run_id: str, experiment_id: str) -> bool:
        """Whether the store holds `run_id` as a live sweep's parent run in `experiment_id`
        (False when it holds no such run)."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._connected().get_run(run_id)
        except MlflowException as e:
            if e.error_code in _NO_SUCH_RUN:
                return False
            raise
        return (
            run.info.experiment_id == experiment_id
            and run.info.lifecycle_stage == "active"
            and run.data.tags.get("amdahl.kind") == "sweep"
        )

    def find_parent(self, experiment_id: str, sweep_dir: Path) -> str | None:
        """The parent run that `create_parent` made for `sweep_dir`, if the store holds one."""
        path = str(sweep_dir.resolve())
        if "'" in path:  # not expressible in a filter string
            return None
        found = self._connected().search_runs(
            [experiment_id],
            filter_string=f"tags.`amdahl.sweep_dir` = '{path}' and tags.`amdahl.kind` = 'sweep'",
            max_results=1,
        )
        return found[0].info.run_id if found else None

    def create_parent(
        self, experiment_id: str, name: str, sweep_dir: Path, tags: Mapping[str, str] | None = None
    ) -> str:
        """A new, open parent run for the sweep in `sweep_dir`, with `tags` from its creation
        (the user among them); its id."""
        own = {"amdahl.sweep_dir": str(sweep_dir.resolve()), "amdahl.kind": "sweep"}
        tags = {**(tags or {}), **own}
        return self._connected().create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def find_child(self, experiment_id: str, parent_id: str, key: str) -> ChildRun | None:
        """The child run of `parent_id` that `create_child` made for row `key`, if any."""
        found = self._connected().search_runs(
            [experiment_id],
            filter_string=f"tags.`{_ROW_TAG}` = '{key}' and "
            f"tags.`mlflow.parentRunId` = '{parent_id}'",
            max_results=1,
        )
        if not found:
            return None
        run = found[0]
        return ChildRun(run.info.run_id, run.info.status, run.data.tags, run.data.params)

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
        tags = {**(tags or {}), "mlflow.parentRunId": parent_id, _ROW_TAG: key}
        return self._connected().create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def log(
        self,
        run_id: str,
        metrics: Iterable[Metric] = (),
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        """Add metric values, params (a param is set once: the same value again is accepted)
        and tags (a tag set again is replaced) to a run, in as few `log_batch` calls as MLflow's
        limits allow (one, when all is empty)."""
        from mlflow.entities import Metric as MlflowMetric
        from mlflow.entities import Param, RunTag

        client = self._connected()
        batch = log_batches(
            [MlflowMetric(m.key, m.value, m.timestamp, m.step) for m in metrics],
            [Param(k, v) for k, v in (params or {}).items()],
            [RunTag(k, v) for k, v in (tags or {}).items()],
        )
        for m, p, t in batch:
            client.log_batch(run_id, metrics=m, params=p, tags=t)

    def log_artifact(self, run_id: str, path: Path) -> None:
        """Attach the file `path` to a run (a file of the same name is replaced)."""
        self._connected().log_artifact(run_id, str(path))

    def end_run(self, run_id: str, status: str) -> None:
        """End a run FINISHED, FAILED or KILLED (a run ended again takes the new status)."""
        self._connected().set_terminated(run_id, status)


def log_batches(metrics: list[Any], params: list[Any], tags: list[Any]) -> Iterator[tuple]:
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


def create_sqlite_store_atomically(uri: str) -> None:
    """Create a new SQLite tracking store under a temporary name and link it into place.

    MLflow builds a new store by running its schema migrations one by one, each committed on its
    own; a driver killed during them (a sweep stopped in its first seconds) leaves a file that
    every later client rejects ("table ... already exists"). Linked into place whole, the store
    either exists complete or not at all. A store that already exists is left alone.
    """
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
        with _schema_logs_quiet():
            MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
        with contextlib.suppress(FileExistsError):  # another process created it meanwhile
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _schema_logs_quiet() -> Iterator[None]:
    """MLflow and alembic log each step of a new store's schema at INFO ("Creating initial
    MLflow database tables...", "Context impl SQLiteImpl."), into the sweep's terminal; inside
    the block only their warnings get through."""
    loggers = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    return True
