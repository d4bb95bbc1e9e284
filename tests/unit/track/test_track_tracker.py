"""The results mirror's mechanism (`Tracker`) against real SQLite MLflow stores: writes run on the
tracker's own thread; an outage (the store locked by another writer, so every call fails with
"database is locked") keeps rows local and `finish` pushes them once it is over; rows a store
holds are never written again (by tracking.json without a call to the store, and by their key
when tracking.json is lost); a failure that is not an outage (the experiment deleted under the
sweep) is reported, not taken for one; each search rung is a child run of its own."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient
from report_rows import scaling_rows, write_sweep

from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import TRACKING_FILE
from amdahl.track.mlflow_store import MlflowBackend
from amdahl.track.tracker import Tracker

EXPERIMENT = "mem"
SPEC = validate_spec({"name": "mem", "workload": "mlp", "tracking": {"experiment": EXPERIMENT}})
#: Seconds a write waits for a locked store before it fails (SQLite's busy timeout, given in
#: the URI): short, so an outage costs the test little.
LOCK_WAIT_S = 0.5


def _uri(path: Path) -> str:
    return f"sqlite:///{path}?timeout={LOCK_WAIT_S}"


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    """A real SQLite store (made before the tracker: a lock needs a file to hold)."""
    path = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _uri(path))
    MlflowClient(tracking_uri=_uri(path)).search_experiments(max_results=1)
    return path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Another writer holds the store: every read and write fails with "database is locked"
    after LOCK_WAIT_S, until it lets go."""
    holder = sqlite3.connect(path, timeout=0, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _tracker(sweep_dir: Path) -> Tracker:
    return Tracker(SPEC, sweep_dir)


def _outcome(rows: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(rows=rows, wall_s=2.0, failed=[])


def _runs(path: Path) -> tuple[list, list]:
    """(parents, children) in the store's experiment."""
    client = MlflowClient(tracking_uri=_uri(path))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def _keys(runs: list) -> list[str]:
    return sorted(r.data.tags["amdahl.row"] for r in runs)


def _history_sizes(path: Path, runs: list) -> dict[str, tuple[str, int]]:
    client = MlflowClient(tracking_uri=_uri(path))
    return {
        r.info.run_id: (r.info.status, len(client.get_metric_history(r.info.run_id, "throughput")))
        for r in runs
    }


@pytest.fixture
def sweep(tmp_path) -> tuple[Path, list[dict]]:
    rows = scaling_rows()
    return write_sweep(tmp_path / "mem-1", rows), rows


def test_a_sweep_records_parent_children_figures_and_files_from_its_own_thread(
    store, sweep, monkeypatch
):
    sweep_dir, rows = sweep
    threads: set[str] = set()
    log = MlflowBackend.log

    def log_and_note_thread(self, *args, **kwargs):  # the real write, and where it ran
        threads.add(threading.current_thread().name)
        return log(self, *args, **kwargs)

    monkeypatch.setattr(MlflowBackend, "log", log_and_note_thread)
    tracker = _tracker(sweep_dir)
    tracker.open_soon()
    for row in rows:
        tracker.log_trial_soon(row)
    tracker._writer.shutdown(wait=True)
    assert threads == {"amdahl-tracking_0"}  # the driver's thread wrote nothing
    tracker.finish(_outcome(rows))
    assert tracker.error is None and tracker.offline_reason is None

    (parents, children) = _runs(store)
    (parent,) = parents
    assert parent.info.status == "FINISHED" and parent.data.params["name"] == "mem"
    artifacts = {a.path for a in MlflowClient().list_artifacts(parent.info.run_id)}
    assert "results.parquet" in artifacts
    metrics = parent.data.metrics
    assert metrics["sweep_wall_s"] == 2.0 and metrics["trials_failed"] == 0.0
    assert any(k.startswith("throughput/") for k in metrics) and parent.data.tags["amdahl.best"]
    assert _keys(children) == sorted(f"{r['trial_id']}:0" for r in rows)
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["sync"] in ("ddp", "none")
        assert child.data.tags["amdahl.status"] == "ok" and "throughput" in child.data.metrics


def test_an_outage_on_the_writer_thread_keeps_rows_local_until_finish(store, sweep, caplog):
    sweep_dir, rows = sweep
    tracker = _tracker(sweep_dir)
    with locked(store), caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.log_trial_soon(rows[0])  # the store is locked: the tracker goes offline
        tracker._writer.shutdown(wait=True)
        tracker._writer = None
        assert tracker.offline_reason and "database is locked" in tracker.offline_reason
        started = time.monotonic()
        assert not tracker.log_trial(rows[1])  # offline: not tried, the driver is not stalled
        assert time.monotonic() - started < LOCK_WAIT_S / 2
    ours = [r.getMessage() for r in caplog.records if r.name == "amdahl.track.tracker"]
    assert len(ours) == 1 and ours[0].startswith("MLflow unreachable")  # said once
    assert _runs(store) == ([], [])  # nothing was written

    tracker.finish(_outcome(rows[:2]))  # the lock is gone: both rows are pushed, once each
    assert tracker.error is None and tracker.offline_reason is None
    parents, children = _runs(store)
    assert _keys(children) == sorted(f"{r['trial_id']}:0" for r in rows[:2])
    assert [p.info.status for p in parents] == ["FINISHED"]
    state = json.loads((sweep_dir / TRACKING_FILE).read_text())
    assert state["stores"][0]["store"] == f"sqlite:///{store}"
    assert len(state["stores"][0]["logged"]) == 2


def test_rows_the_store_holds_are_not_written_again(store, sweep, tmp_path, monkeypatch):
    sweep_dir, rows = sweep
    assert _tracker(sweep_dir).sync(rows) == len(rows)
    held = _history_sizes(store, _runs(store)[1])

    with locked(store):  # by tracking.json: no call to the store at all, so no outage
        again = _tracker(sweep_dir)
        assert again.sync(rows) == 0
        assert again.offline_reason is None and again.error is None

    (sweep_dir / TRACKING_FILE).unlink()  # lost: the parent and rows are found by their key
    more = [*rows, {**rows[0], "trial_id": "extra"}]
    assert _tracker(sweep_dir).sync(more) == 1
    parents, children = _runs(store)
    assert len(parents) == 1 and len(children) == len(rows) + 1
    sizes = _history_sizes(store, children)
    assert all(sizes[run_id] == held[run_id] for run_id in held)  # nothing logged twice

    # Another store (a copied directory synced elsewhere) gets everything.
    other = tmp_path / "other.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _uri(other))
    assert _tracker(sweep_dir).sync(more) == len(more)
    assert len(_runs(other)[1]) == len(more)


def test_a_retried_row_updates_its_run_without_logging_its_params_again(store, sweep):
    sweep_dir, rows = sweep
    tracker = _tracker(sweep_dir)
    assert tracker.sync([{**rows[0], "status": "failed"}]) == 1
    ((child,),) = [_runs(store)[1]]
    assert child.info.status == "FAILED"
    # now ok; MLflow refuses a param logged again with a new value
    assert tracker.sync([{**rows[0], "params": json.dumps({"hidden": [99]})}]) == 1
    assert tracker.error is None
    (again,) = _runs(store)[1]
    assert again.info.run_id == child.info.run_id and again.info.status == "FINISHED"
    assert json.loads(again.data.params["params.hidden"]) == [16]  # set once, when first logged


def test_a_failure_that_is_not_an_outage_is_reported_and_the_next_row_still_logs(
    store, sweep, caplog
):
    """The experiment is deleted under the running sweep (MLflow refuses runs in it: not an
    outage) and restored: the next row logs at once, not held back as if the store were
    down, and `finish` pushes the one that failed."""
    sweep_dir, rows = sweep
    tracker = _tracker(sweep_dir)
    tracker.open_soon()
    tracker._writer.shutdown(wait=True)
    tracker._writer = None
    client = MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    client.delete_experiment(experiment)
    assert not tracker.log_trial(rows[0])
    assert tracker.offline_reason is None and "MlflowException" in tracker.error
    client.restore_experiment(experiment)
    assert tracker.log_trial(rows[1])  # not held back as if offline
    with caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.finish(_outcome(rows[:2]))  # finish pushes the first row too
    (message,) = [r.getMessage() for r in caplog.records if r.name == "amdahl.track.tracker"]
    assert "MLflow tracking failed with an error that is not an outage" in message
    assert "0 of 2 rows are not in MLflow" in message
    assert len(_runs(store)[1]) == 2


def test_each_search_rung_of_a_trial_is_a_child_run_of_its_own(store, sweep):
    sweep_dir, rows = sweep
    tracker = _tracker(sweep_dir)
    rungs = [{**rows[0], "rung": 0, "steps": 5}, {**rows[0], "rung": 1, "steps": 15}]
    skipped = {**rows[1], "rung": 0, "status": "skipped", "error": "predicted 10 samples/s"}
    assert tracker.sync([*rungs, skipped]) == 3
    by_key = {c.data.tags["amdahl.row"]: c for c in _runs(store)[1]}
    tid, other = rows[0]["trial_id"], rows[1]["trial_id"]
    assert set(by_key) == {f"{tid}:0:rung0", f"{tid}:0:rung1", f"{other}:0:rung0"}
    assert by_key[f"{tid}:0:rung1"].data.params["rung"] == "1"
    assert by_key[f"{tid}:0:rung1"].data.tags["mlflow.runName"].endswith("-rung1")
    # a skipped configuration failed nothing: its run is finished, its status tagged
    assert by_key[f"{other}:0:rung0"].info.status == "FINISHED"
    assert by_key[f"{other}:0:rung0"].data.tags["amdahl.status"] == "skipped"
    assert tracker.sync([*rungs, skipped]) == 0  # idempotent per rung
