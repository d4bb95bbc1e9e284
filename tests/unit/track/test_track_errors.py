"""Only an outage is an outage: a tracking failure that is not one (a bug, a state file that
cannot be written) is neither reported as "MLflow unreachable" nor lost on the tracker's thread;
it is said once, at the end, while the rows stay in results.parquet. A corrupt tracking.json is
one UserError naming the file and the fix."""

from __future__ import annotations

import json
import logging
import sqlite3
from types import SimpleNamespace

import pytest
import requests
import sqlalchemy.exc
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    RESOURCE_DOES_NOT_EXIST,
    TEMPORARILY_UNAVAILABLE,
)
from mlflow.tracking import MlflowClient

from amdahl.errors import UserError
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import TRACKING_FILE
from amdahl.track.mlflow_store import is_outage
from amdahl.track.tracker import Tracker


def _row(trial_id: str, **extra) -> dict:
    return {
        "trial_id": trial_id,
        "repeat": 0,
        "devices": 1,
        "batch_size": 32,
        "precision": "fp32",
        "compile": "eager",
        "sync": "ddp",
        "status": "ok",
        "throughput": 100.0,
        **extra,
    }


def _outcome(rows: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(rows=rows, wall_s=1.0, failed=[])


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    return Tracker(validate_spec({"name": "errors", "workload": "mlp"}), sweep_dir)


def _children(tracker: Tracker) -> list:
    client = MlflowClient(tracking_uri=tracker.backend.uri)
    runs = client.search_runs([client.get_experiment_by_name("errors").experiment_id])
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def _caused_by(cause: BaseException, error: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException:
            raise error  # noqa: B904 - implicit chaining, as MLflow's REST client does
    except BaseException as e:
        return e


def test_only_connection_and_unavailable_errors_are_outages():
    refused = requests.exceptions.ConnectionError("Connection refused")
    assert is_outage(refused)
    assert is_outage(_caused_by(refused, MlflowException("API request to ... failed")))
    assert is_outage(requests.exceptions.RetryError("too many 503 error responses"))
    assert is_outage(MlflowException("busy", error_code=TEMPORARILY_UNAVAILABLE))
    assert is_outage(sqlite3.OperationalError("database is locked"))
    locked = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked"))
    assert is_outage(locked)

    assert not is_outage(KeyError("devices"))
    assert not is_outage(TypeError("unsupported operand"))
    assert not is_outage(MlflowException("bad", error_code=INVALID_PARAMETER_VALUE))
    assert not is_outage(MlflowException("gone", error_code=RESOURCE_DOES_NOT_EXIST))
    assert not is_outage(sqlite3.OperationalError("no such column: x"))


def test_a_bug_is_not_an_outage_and_is_reported_once_at_the_end(tracker, caplog):
    bad = _row("bad")
    del bad["devices"]  # a bug: a row without a column the tracker needs
    assert not tracker.log_trial(bad)
    assert tracker.offline_reason is None  # not "MLflow unreachable"
    assert tracker.error and "KeyError: 'devices'" in tracker.error
    assert tracker.log_trial(_row("good"))  # the next row is not held back as if offline

    with caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.finish(_outcome([bad, _row("good")]))
    messages = [r for r in caplog.records if r.name == "amdahl.track.tracker"]
    assert [r.levelno for r in messages] == [logging.ERROR]
    text = messages[0].getMessage()
    assert "not an outage" in text and "KeyError: 'devices'" in text
    assert "1 of 2 rows are not in MLflow" in text and "platform mlflow-push" in text
    assert "unreachable" not in text
    assert [c.data.tags["amdahl.row"] for c in _children(tracker)] == ["good:0"]


def test_a_state_file_that_cannot_be_written_is_reported_not_lost(tracker, caplog):
    tracker.open_soon()
    tracker.finish(_outcome([]))  # the parent run exists; now make tracking.json unwritable
    (tracker.sweep_dir / TRACKING_FILE).unlink()
    (tracker.sweep_dir / TRACKING_FILE).mkdir()  # os.replace onto a directory fails, like ENOSPC

    tracker.log_trial_soon(_row("a"))  # on the tracker's own thread
    with caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.finish(_outcome([_row("a")]))
    text = " ".join(r.getMessage() for r in caplog.records if r.name == "amdahl.track.tracker")
    assert f"could not write {tracker.sweep_dir / TRACKING_FILE}" in text
    assert [c.data.tags["amdahl.row"] for c in _children(tracker)] == ["a:0"]  # still logged


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"parent_run_id": null}',
        '{"logged": {"t:0": "run"}}',
        '{"version": 2, "stores": [{"logged": []}]}',
        '{"version": 7, "stores": []}',
        "\xff\xfe",
    ],
)
def test_a_corrupt_state_file_is_one_user_error_naming_it_and_the_fix(tmp_path, content):
    path = tmp_path / TRACKING_FILE
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(UserError) as e:
        Tracker(validate_spec({"workload": "mlp"}), tmp_path)
    message = str(e.value)
    assert message.startswith(f"{path}: not a readable tracking state (")
    assert "move it aside" in message and f"platform mlflow-push {tmp_path}" in message


def test_old_state_files_stay_readable(tmp_path):
    old = {
        "parent_run_id": "abc",
        "experiment_id": "1",
        "logged": {"t:0": {"run_id": "r", "status": "ok"}},
    }
    (tmp_path / TRACKING_FILE).write_text(json.dumps(old))
    tracker = Tracker(validate_spec({"workload": "mlp"}), tmp_path, enabled=False)
    assert tracker.state["stores"] == [{"store": None, "experiment": None, **old}]
