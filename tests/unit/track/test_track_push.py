"""`push_results` (what `platform mlflow-push` runs): a sweep directory's rows go into a real
SQLite MLflow store once, a second push finds them there, a new row alone is pushed; the push
holds the directory's lock (refused while a driver holds it, and refusing a driver while it
runs); an outage or an error that is not one comes back in the outcome, never raised."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

import amdahl
import amdahl.track.tracker
from amdahl.errors import UserError
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import SPEC_FILE, TRACKING_FILE
from amdahl.sweepdir.lock import lock_sweep_dir
from amdahl.sweepdir.table import append_rows
from amdahl.track.mlflow_store import FAIL_FAST_HTTP, MlflowBackend
from amdahl.track.push import PushOutcome, push_results
from amdahl.track.ui_link import tracking_link

EXPERIMENT = "pushed"


def _row(trial_id: str, status: str = "ok") -> dict:
    return {
        "sweep": "tiny",
        "trial_id": trial_id,
        "repeat": 0,
        "launch_id": "L0",
        "workload": "mlp",
        "params": json.dumps({"hidden": [16]}),
        "devices": 1,
        "batch_size": 32,
        "precision": "fp32",
        "compile": "eager",
        "sync": "ddp",
        "status": status,
        "throughput": 100.0,
        "step_time_s": 0.01,
    }


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A fresh SQLite MLflow store (as tests/integration/conftest.py's `mlflow_uri`), and none
    of MLflow's HTTP settings that the tracker sets for a push's duration."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for name in FAIL_FAST_HTTP:
        monkeypatch.delenv(name, raising=False)
    return uri


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    """A sweep directory as a driver leaves it: spec.yaml and two rows."""
    path = tmp_path / "runs" / "tiny-20250101T120000Z"
    path.mkdir(parents=True)
    spec = validate_spec(
        {"name": "tiny", "workload": "mlp", "tracking": {"experiment": EXPERIMENT}}
    )
    (path / SPEC_FILE).write_text(yaml.safe_dump(spec.model_dump(), sort_keys=False))
    append_rows(path, [_row("a"), _row("b", status="failed")])
    return path


def _children(uri: str) -> list[str]:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return sorted(r.data.tags["amdahl.row"] for r in runs if "mlflow.parentRunId" in r.data.tags)


def test_rows_are_pushed_once_and_a_new_row_alone_later(store, sweep_dir):
    first = push_results(sweep_dir)
    # the tracker's fail-fast HTTP settings last for the push only
    assert not set(FAIL_FAST_HTTP) & set(os.environ)
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name(EXPERIMENT)
    link = tracking_link(store, experiment.experiment_id)  # where to look, on `mlflow ui`
    assert first == PushOutcome(results=sweep_dir / "results.parquet", rows=2, pushed=2, link=link)
    assert first.ok and first.already_there == 0
    assert _children(store) == ["a:0", "b:0"]

    again = push_results(str(sweep_dir))
    assert (again.pushed, again.already_there, again.ok) == (0, 2, True)

    append_rows(sweep_dir, [_row("c")])
    third = push_results(sweep_dir)
    assert (third.pushed, third.already_there) == (1, 2)
    assert _children(store) == ["a:0", "b:0", "c:0"]


def test_rows_the_store_holds_are_found_without_the_tracking_state(store, sweep_dir):
    push_results(sweep_dir)
    (sweep_dir / TRACKING_FILE).unlink()  # moved aside: MLflow is asked by the rows' tags
    outcome = push_results(sweep_dir)
    assert outcome.ok and outcome.pushed == 0
    assert _children(store) == ["a:0", "b:0"]


def test_a_push_is_refused_while_a_driver_holds_the_directory(store, sweep_dir):
    with lock_sweep_dir(sweep_dir):
        with pytest.raises(UserError, match="is in use by another sweep driver \\(pid ") as e:
            push_results(sweep_dir)
    assert "its driver pushes its rows to MLflow itself" in str(e.value)
    assert _children(store) == [] and not (sweep_dir / TRACKING_FILE).exists()
    assert push_results(sweep_dir).pushed == 2  # and goes through once it is let go


def test_a_driver_is_refused_while_a_push_holds_the_directory(store, sweep_dir, monkeypatch):
    refused = []
    sync = amdahl.track.tracker.Tracker.sync

    def sync_meanwhile(self, rows):  # a driver starts while the push runs
        with pytest.raises(UserError, match="in use by another MLflow push") as e:
            lock_sweep_dir(sweep_dir)
        refused.append(str(e.value))
        return sync(self, rows)

    monkeypatch.setattr(amdahl.track.tracker.Tracker, "sync", sync_meanwhile)
    assert push_results(sweep_dir).pushed == 2
    assert len(refused) == 1
    lock_sweep_dir(sweep_dir).release()  # the push let go when it ended


def test_a_directory_without_a_spec_is_a_user_error(tmp_path, store):
    with pytest.raises(UserError, match="not a sweep directory"):
        push_results(tmp_path)
    assert not (tmp_path / "driver.lock").exists()


def test_an_outage_is_in_the_outcome_not_raised(sweep_dir, store, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    outcome = push_results(sweep_dir)
    assert outcome.offline_reason and outcome.error is None and not outcome.ok
    assert outcome.pushed == 0 and outcome.link is None  # no link to a store that is down


def test_an_error_that_is_no_outage_is_in_the_outcome(store, sweep_dir, monkeypatch):
    def end_run(self, run_id, status):
        raise ValueError("a bug")

    monkeypatch.setattr(MlflowBackend, "end_run", end_run)
    outcome = push_results(sweep_dir)
    assert outcome.offline_reason is None and not outcome.ok
    assert outcome.error and "ValueError: a bug" in outcome.error
    assert outcome.pushed == 0


def test_the_push_is_part_of_the_public_api():
    assert amdahl.push_results is push_results and amdahl.PushOutcome is PushOutcome
    assert {"push_results", "PushOutcome"} <= set(amdahl.__all__)
