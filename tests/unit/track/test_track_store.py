"""A new SQLite tracking store appears whole or not at all: MLflow runs its schema migrations one
commit at a time, and a driver killed during them used to leave a store no client could open."""

import signal
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient

from amdahl.track.mlflow_store import create_sqlite_store_atomically


def test_killed_while_creating_leaves_no_store(tmp_path):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    create = (
        f"from amdahl.track.mlflow_store import create_sqlite_store_atomically as c; c({uri!r})"
    )
    proc = subprocess.Popen([sys.executable, "-c", create])
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".mlflow.db.*.creating")):  # the migrations have started
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not db.exists()

    create_sqlite_store_atomically(uri)  # the next sweep creates it cleanly
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("after-kill")
    assert client.get_experiment(experiment_id).name == "after-kill"
    assert [p.name for p in tmp_path.iterdir()] == ["mlflow.db"]  # the killed one's leftover gone


def test_existing_store_is_left_alone(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    create_sqlite_store_atomically(uri)
    MlflowClient(tracking_uri=uri).create_experiment("kept")
    before = (tmp_path / "mlflow.db").stat().st_mtime_ns
    create_sqlite_store_atomically(uri)
    assert (tmp_path / "mlflow.db").stat().st_mtime_ns == before
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("kept") is not None


def test_the_default_store_is_created_atomically_too(tmp_path):
    """No tracking URI anywhere: MLflow's default store (sqlite:///mlflow.db in the working
    directory) goes through the same atomic creation, so a driver killed during its migrations
    leaves no store, and the next one creates it cleanly."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    connect = (
        "from amdahl.spec.load import validate_spec; from amdahl.track.tracker import Tracker; "
        "Tracker(validate_spec({'workload': 'mlp'}), '.', enabled=True).backend.connect()"
    )
    proc = subprocess.Popen([sys.executable, "-c", connect], cwd=tmp_path, env=env)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".mlflow.db.*.creating")):  # the migrations have started
        assert proc.poll() is None, "the default store was not created through a temporary file"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "mlflow.db").exists()

    subprocess.run([sys.executable, "-c", connect], cwd=tmp_path, env=env, check=True)
    assert MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
