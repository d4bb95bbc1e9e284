"""The tracker's fail-fast MLflow HTTP settings live only as long as the sweep (MLflow reads
them from the process environment, which a Python caller of run_sweep shares)."""

import os
from types import SimpleNamespace

from amdahl.spec.load import validate_spec
from amdahl.track.tracker import Tracker

RETRIES, TIMEOUT = "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"


def test_http_settings_are_restored_after_the_sweep(tmp_path, monkeypatch):
    monkeypatch.delenv(RETRIES, raising=False)
    monkeypatch.setenv(TIMEOUT, "33")  # the caller's own choice is kept
    spec = validate_spec(
        {"workload": "mlp", "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}
    )
    tracker = Tracker(spec, tmp_path)
    tracker.backend.connect()
    assert os.environ[RETRIES] == "1" and os.environ[TIMEOUT] == "33"
    tracker.finish(SimpleNamespace(rows=[], wall_s=1.0, failed=[]))
    assert RETRIES not in os.environ and os.environ[TIMEOUT] == "33"


def test_the_environment_is_changed_only_from_the_callers_thread(tmp_path, monkeypatch):
    """os.environ is process-wide and not safe to change from the tracker's own thread while
    the driver's threads read it: the settings are made before that thread exists."""
    import threading

    monkeypatch.delenv(RETRIES, raising=False)
    monkeypatch.delenv(TIMEOUT, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    setters: list[str] = []
    environ = type(os.environ)
    real_setitem = environ.__setitem__

    def recording_setitem(self, key, value):
        if key.startswith("MLFLOW_HTTP"):
            setters.append(threading.current_thread().name)
        real_setitem(self, key, value)

    monkeypatch.setattr(environ, "__setitem__", recording_setitem)
    tracker = Tracker(validate_spec({"workload": "mlp"}), tmp_path)
    tracker.open_soon()  # connects on the tracker's thread
    tracker.finish(SimpleNamespace(rows=[], wall_s=1.0, failed=[]))
    assert tracker.state["stores"][0]["parent_run_id"] is not None and tracker.error is None
    assert setters and set(setters) == {threading.current_thread().name}
