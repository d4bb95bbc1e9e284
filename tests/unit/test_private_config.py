"""Credentials never enter a sweep's files, and the files that hold its configuration are
private: a password inside a URI in the sweep file is refused (naming the key and the
environment-based fix, never echoing the password), URIs in messages are shown with the password
masked, and spec.yaml, plan.json, results.parquet, tracking.json, calibration.json, the reports
and ray.log are created 0o600 in a 0o700 sweep directory whatever the umask."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
from pathlib import Path

import pytest

from amdahl.driver import calibrate
from amdahl.driver.cluster import route_ray_logs
from amdahl.errors import UserError
from amdahl.files import private_dir, redact_uris, uri_passwords, write_private
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.report import write_reports
from amdahl.spec.load import load_spec, validate_spec
from amdahl.sweepdir.driver_files import write_sweep_files as _write_sweep_files
from amdahl.sweepdir.layout import RESULTS_FILE, TRACKING_FILE, new_sweep_dir
from amdahl.sweepdir.table import append_rows
from amdahl.track.tracker import Tracker
from workloads.mlp import MLP

SECRET = "s3cr3t"
GOOD = "workload: mlp\n"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """The most permissive umask, so only the code's own modes keep files private."""
    old = os.umask(0)
    yield
    os.umask(old)


def _refusal(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        load_spec(path, overrides)
    message = str(e.value)
    assert SECRET not in message
    return message


# ---- refused in the sweep file -------------------------------------------------------------


def test_password_in_tracking_uri_is_refused_with_the_mlflow_environment_fix(tmp_path):
    message = _refusal(tmp_path, GOOD + f"tracking:\n  uri: http://alice:{SECRET}@mlflow:5000\n")
    assert message.startswith(f"{tmp_path / 'sweep.yaml'}:3: tracking.uri: ")
    assert "http://alice:***@mlflow:5000" in message
    assert "MLFLOW_TRACKING_USERNAME" in message and "MLFLOW_TRACKING_PASSWORD" in message


def test_password_in_any_string_is_refused_with_its_path(tmp_path):
    data = f"s3://AKIAEXAMPLE:{SECRET}/x+y@bucket/data"  # a raw `/` in the secret too
    message = _refusal(tmp_path, GOOD + f"params:\n  data: {data}\n")
    assert ":3: params.data: " in message
    assert "s3://AKIAEXAMPLE:***@bucket/data" in message
    assert "AWS_ACCESS_KEY_ID" in message and "~/.aws/credentials" in message

    message = _refusal(tmp_path, GOOD + f"storage: s3://k:{SECRET}@bucket/amdahl\n")
    assert ":2: storage: " in message

    grid = f"grid:\n  params.data: [/data/a, 'gs://k:{SECRET}@b/x']\n"
    assert ":3: grid.params.data[1]: " in _refusal(tmp_path, GOOD + grid)

    message = _refusal(tmp_path, GOOD, (f"tracking.uri=https://bob:{SECRET}@host",))
    assert message.startswith("--set tracking.uri: ")

    with pytest.raises(UserError, match=r"exclude\[0\]\.params\.data"):
        validate_spec({"workload": "mlp", "exclude": [{"params.data": f"s3://a:{SECRET}@b"}]})


def test_uris_without_a_password_are_accepted(tmp_path):
    for uri in (
        "http://alice@mlflow:5000",
        "http://mlflow:5000/path@x",
        "sqlite:////tmp/a:b@c.db",
        "databricks",
    ):
        assert validate_spec({"workload": "mlp", "tracking": {"uri": uri}}).tracking.uri == uri
    spec = validate_spec({"workload": "mlp", "params": {"data": "s3://bucket/path@v1"}})
    assert spec.params["data"] == "s3://bucket/path@v1"


def test_uri_passwords_are_masked_in_messages():
    assert redact_uris(f"API request to http://u:{SECRET}@h:5000/api failed") == (
        "API request to http://u:***@h:5000/api failed"
    )
    assert redact_uris(f"'postgresql://u:p%40{SECRET}@db/m' and s3://K:{SECRET}/a@b/c") == (
        "'postgresql://u:***@db/m' and s3://K:***@b/c"
    )
    assert redact_uris(f"http://u:p@{SECRET}@host/x") == "http://u:***@host/x"
    for plain in ("http://host:5000/x@y", "http://alice@host", "no uri: a:b@c", "file:///a:b"):
        assert redact_uris(plain) == plain and not uri_passwords(plain)


def test_an_environment_uri_with_a_password_never_reaches_messages_or_files(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on: an outage
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{SECRET}@127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    tracker = Tracker(validate_spec({"workload": "mlp"}), tmp_path)
    row = {"trial_id": "t", "repeat": 0, "status": "ok"}
    assert not tracker.log_trial(row)
    assert tracker.offline_reason and "alice:***@127.0.0.1" in tracker.offline_reason
    assert SECRET not in tracker.offline_reason
    tracker._save_state()
    state = (tmp_path / TRACKING_FILE).read_text()
    assert SECRET not in state and "alice" not in state
    assert json.loads(state)["stores"][0]["store"].startswith("http://127.0.0.1:")


# ---- owner-only files ----------------------------------------------------------------------


def test_write_private_is_owner_only_whole_and_leaves_nothing_behind(tmp_path, open_umask):
    path = write_private(tmp_path / "a.json", "{}")
    assert _mode(path) == 0o600 and path.read_text() == "{}"
    (tmp_path / "b").write_text("old")
    os.chmod(tmp_path / "b", 0o644)
    write_private(tmp_path / "b", b"new")
    assert _mode(tmp_path / "b") == 0o600 and (tmp_path / "b").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b"]

    d = private_dir(tmp_path / "runs" / "x")
    assert _mode(d) == 0o700
    with pytest.raises(FileExistsError):
        private_dir(d)
    assert private_dir(d, exist_ok=True) == d


def test_every_file_of_a_sweep_directory_is_owner_only(tmp_path, open_umask):
    sweep_dir = new_sweep_dir(tmp_path / "runs", "private")
    assert _mode(sweep_dir) == 0o700

    spec = validate_spec({"name": "private", "workload": "mlp"})
    _write_sweep_files(
        sweep_dir, spec, plan_sweep(spec, [Node(cpus=2.0)], WorkloadFacts(MLP.defaults))
    )
    append_rows(sweep_dir, [{"sweep": "private", "trial_id": "a", "repeat": 0, "status": "ok"}])
    write_reports(sweep_dir)
    calibrate.write_calibration(sweep_dir, {"devices": 2})
    Tracker(spec, sweep_dir, enabled=False)._save_state()

    loggers = {n: logging.getLogger(n) for n in ("ray", "ray.tune", "ray.train", "ray.data")}
    saved = {n: (lg.handlers, lg.propagate) for n, lg in loggers.items()}
    try:
        route_ray_logs(sweep_dir / "ray.log")
    finally:
        loggers["ray"].handlers[0].close()
        for n, (handlers, propagate) in saved.items():
            loggers[n].handlers, loggers[n].propagate = handlers, propagate

    names = {"spec.yaml", "plan.json", RESULTS_FILE, "report.md", "report.html", "calibration.json"}
    names |= {TRACKING_FILE, "ray.log"}
    files = {p.name: _mode(p) for p in sweep_dir.iterdir() if p.is_file()}
    assert names <= set(files), files
    assert {n: m for n, m in files.items() if m != 0o600} == {}
