"""The tracker's fail-fast MLflow HTTP settings live only as long as the sweep (MLflow reads
them from the process environment, which a Python caller of run_sweep shares)."""

import os
from types import SimpleNamespace

from amdahl.spec import validate_spec
from amdahl.track import Tracker

RETRIES, TIMEOUT = "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"


def test_http_settings_are_restored_after_the_sweep(tmp_path, monkeypatch):
    monkeypatch.delenv(RETRIES, raising=False)
    monkeypatch.setenv(TIMEOUT, "33")  # the caller's own choice is kept
    spec = validate_spec(
        {"workload": "mlp", "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    )
    tracker = Tracker(spec, tmp_path)
    tracker._client_or_raise()
    assert os.environ[RETRIES] == "1" and os.environ[TIMEOUT] == "33"
    tracker.finish(SimpleNamespace(rows=[], wall_s=1.0, failed=[]))
    assert RETRIES not in os.environ and os.environ[TIMEOUT] == "33"
