"""Faults lose nothing: a killed driver resumes, Ctrl-C stops cleanly, a killed worker is
retried or recorded, an MLflow outage is caught up by `platform mlflow-push`.

The CLI tests run `platform sweep` as a child process with its own local Ray (the process
tree ends with it); the worker-kill test uses the session's Ray.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow_server import free_port, start_mlflow, stop

from amdahl import read_results, run_sweep, validate_spec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SPEC = """name: faults
workload: mlp
params: {hidden: [32], train_rows: 2048, val_rows: 256}
train: {steps: 150, warmup_steps: 2}
grid: {devices: [1], batch_size: [32, 64, 128], sync: [ddp, none]}
resources: {cpus_per_device: 0.5, cpus_per_data_worker: 0.5}
"""


def _cli(*args: str, env: dict, cwd: Path) -> subprocess.Popen:
    if args[0] == "sweep" and "--local" not in args:
        args = (*args, "--local")  # its own Ray, not the test session's
    return subprocess.Popen(
        [sys.executable, "-m", "amdahl.cli.commands", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(runs: Path) -> list[dict]:
    dirs = sorted(runs.glob("faults-*"))
    if not dirs or not (dirs[0] / "results.parquet").exists():
        return []
    return read_results(dirs[0]).to_pylist()


def _wait_for_rows(runs: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(_rows(runs)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no results appeared"
        time.sleep(0.5)


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "faults.yaml").write_text(SPEC)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "PYTHONUNBUFFERED": "1",
    }
    return tmp_path, env


def _children(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("faults")
    runs = client.search_runs([experiment.experiment_id])
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def test_killed_driver_resumes_without_duplicates(workdir):
    tmp, env = workdir
    proc = _cli("sweep", "faults.yaml", env=env, cwd=tmp)
    _wait_for_rows(tmp / "runs", 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = {(r["trial_id"], r["repeat"]): r for r in _rows(tmp / "runs")}
    assert 2 <= len(before) < 6

    resumed = _cli("sweep", "faults.yaml", "--resume", env=env, cwd=tmp)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    after = _rows(tmp / "runs")
    keys = [(r["trial_id"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 6
    for key, row in before.items():  # rows finished before the kill are untouched
        assert next(r for r in after if (r["trial_id"], r["repeat"]) == key) == row
    rows = {r["trial_id"] for r in after}
    children = _children(env["MLFLOW_TRACKING_URI"])
    assert sorted(c.data.params["trial_id"] for c in children) == sorted(rows)


def test_ctrl_c_stops_cleanly_and_prints_the_resume_command(workdir):
    tmp, env = workdir
    # Longer trials than SPEC's: with 150 steps a loaded CI box finished all six before the
    # signal, polled 0.5 s after the first row, reached the driver (the sweep then stopped in its
    # closing calibration and had nothing left to resume).
    (tmp / "faults.yaml").write_text(SPEC.replace("steps: 150", "steps: 1500"))
    proc = _cli("sweep", "faults.yaml", env=env, cwd=tmp)
    _wait_for_rows(tmp / "runs", 1, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "resume with: platform sweep faults.yaml --resume runs/faults-" in err
    assert "Traceback" not in err
    done = _rows(tmp / "runs")
    assert 1 <= len(done) < 6 and all(r["status"] == "ok" for r in done)

    command = err.split("resume with: ")[1].split()
    resumed = _cli(*command[1:], env=env, cwd=tmp)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert len({r["trial_id"] for r in _rows(tmp / "runs")}) == 6


def _kill_first_train_worker(stop: threading.Event, runs: Path) -> None:
    """SIGKILL one Ray Train worker of this session's cluster (found by its actor record) in
    the middle of the sweep's second trial: after the first row, so inside the trials rather
    than in Ray Train's process-group setup (a worker dying there leaves its peers in
    init_process_group until the 600 s timeout: Ray Train waits for them before it polls)."""
    from ray._private.state import actors

    while not stop.is_set() and not any(
        (d / "results.parquet").exists() for d in runs.glob("workerkill-*")
    ):
        time.sleep(0.1)
    while not stop.is_set():
        workers = [
            a
            for a in actors().values()
            if a["ActorClassName"] == "RayTrainWorker" and a["State"] == "ALIVE"
        ]
        if workers and workers[0].get("Pid"):
            time.sleep(0.5)  # into the next trial's measured steps
            os.kill(workers[0]["Pid"], signal.SIGKILL)
            return
        time.sleep(0.2)


@pytest.mark.parametrize("max_failures, expect_ok", [(0, False), (1, True)])
def test_killed_worker_is_retried_or_recorded(ray_cluster, tmp_path, max_failures, expect_ok):
    spec = validate_spec(
        {
            "name": "workerkill",
            "workload": "mlp",
            "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
            # Long enough that the kill, 0.5 s after a worker is found, lands inside a trial:
            # a warm launch starts the next trial at once, and a 400-step one was over first.
            "train": {"steps": 3000, "warmup_steps": 2, "max_failures": max_failures},
            "grid": {"devices": [1, 2], "batch_size": [32, 64], "sync": ["ddp"]},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
        }
    )
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_train_worker, args=(stop, tmp_path), daemon=True)
    killer.start()
    try:
        outcome = run_sweep(spec, runs_dir=tmp_path, tracking=False)
    finally:
        stop.set()
    rows = read_results(outcome.sweep_dir).to_pylist()
    keys = [(r["trial_id"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4  # every trial recorded once, the sweep went on
    if expect_ok:
        assert all(r["status"] == "ok" for r in rows)
    else:  # one crash costs the trial it hit, with the reason; the rest ran in a new launch
        failed = [r for r in rows if r["status"] != "ok"]
        assert len(failed) == 1 and failed[0]["error"].startswith("launch failed: ")


def test_mlflow_outage_mid_sweep_then_sync(tmp_path):
    port = free_port()
    store = tmp_path / "mlflow"
    store.mkdir()
    (tmp_path / "faults.yaml").write_text(SPEC)
    uri = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    server = start_mlflow(port, store)
    try:
        sweep = _cli("sweep", "faults.yaml", env=env, cwd=tmp_path)
        _wait_for_rows(tmp_path / "runs", 1, sweep)
        stop(server)  # outage mid-sweep
        out, err = sweep.communicate(timeout=600)
        assert sweep.returncode == 0, err  # the sweep went on
        rows = _rows(tmp_path / "runs")
        assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)

        server = start_mlflow(port, store)
        sweep_dir = next((tmp_path / "runs").glob("faults-*"))
        synced = subprocess.run(
            [sys.executable, "-m", "amdahl.cli.commands", "sync", str(sweep_dir)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert synced.returncode == 0, synced.stderr
        again = subprocess.run(
            [sys.executable, "-m", "amdahl.cli.commands", "sync", str(sweep_dir)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert again.stdout.startswith("0 rows pushed")  # idempotent
        children = _children(uri)
        assert sorted(c.data.params["trial_id"] for c in children) == sorted(
            r["trial_id"] for r in rows
        )
    finally:
        stop(server)


def _parent_status(uri: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("faults")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parent.info.status


def test_sigterm_stops_cleanly_like_ctrl_c(workdir):
    """`ray job stop` sends SIGTERM: the same clean stop as Ctrl-C, exit 143."""
    tmp, env = workdir
    # Trials long enough (a few seconds each) that the stop lands before the last one: at
    # 100 steps a loaded CI box once saw all six rows before the signal took effect.
    proc = _cli("sweep", "faults.yaml", "--set", "train.steps=1500", env=env, cwd=tmp)
    _wait_for_rows(tmp / "runs", 1, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM: finished trials are saved in runs/faults-" in err
    assert "resume with: platform sweep faults.yaml --set train.steps=1500 --resume runs/" in err
    assert "Traceback" not in err
    [sweep_dir] = sorted((tmp / "runs").glob("faults-*"))
    done = _rows(tmp / "runs")
    assert 1 <= len(done) < 6 and all(r["status"] == "ok" for r in done)
    assert (sweep_dir / "report.md").exists() and (sweep_dir / "report.html").exists()
    assert _parent_status(env["MLFLOW_TRACKING_URI"]) == "KILLED"

    command = err.split("resume with: ")[1].split()
    resumed = _cli(*command[1:], env=env, cwd=tmp)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    keys = [(r["trial_id"], r["repeat"]) for r in _rows(tmp / "runs")]
    assert len(keys) == len(set(keys)) == 6


def test_a_second_driver_cannot_join_a_running_sweep(workdir):
    """`--resume` (newest directory, or the directory named) while the sweep still runs is
    refused, naming the running driver; nothing is run twice or made anew."""
    tmp, env = workdir
    proc = _cli("sweep", "faults.yaml", "--set", "train.steps=600", env=env, cwd=tmp)
    try:
        _wait_for_rows(tmp / "runs", 1, proc)
        [live] = sorted((tmp / "runs").glob("faults-*"))
        seconds = [
            _cli("sweep", "faults.yaml", "--set", "train.steps=600", *resume, env=env, cwd=tmp)
            for resume in (["--resume"], ["--resume", str(live.relative_to(tmp))])
        ]
        for second in seconds:
            _, err = second.communicate(timeout=120)
            assert second.returncode == 2, err
            assert f"is in use by another sweep driver (pid {proc.pid} on host " in err
            assert "Traceback" not in err
        assert proc.poll() is None, "the sweep ended before the second drivers were refused"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert sorted((tmp / "runs").glob("faults-*")) == [live]
    rows = _rows(tmp / "runs")
    keys = [(r["trial_id"], r["repeat"]) for r in rows]
    assert len(keys) == len(set(keys)) and all(r["status"] == "ok" for r in rows)

    # The stopped driver let go; a resume with other settings is refused with the difference.
    changed = _cli("sweep", "faults.yaml", "--set", "train.steps=20", "--resume", env=env, cwd=tmp)
    _, err = changed.communicate(timeout=120)
    assert changed.returncode == 2, err
    assert "train.steps: 600 -> 20" in err and "--new-if-changed" in err
    assert "Traceback" not in err
