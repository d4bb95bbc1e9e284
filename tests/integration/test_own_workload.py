"""A user's own workload run as docs/workload.md tells a new user, and a sweep file with no
`resources:` on a 2-CPU Ray. The CLI runs are subprocesses started in the workload's own folder,
with no PYTHONPATH: the driver must find the code there and Ray's workers get it through the
runtime_env."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from amdahl import read_results, run_sweep, validate_spec

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
PLATFORM = Path(sys.executable).parent / "platform"


def _platform(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{cwd / 'mlflow.db'}"
    if args[0] == "sweep":
        args = [*args, "--local"]  # its own Ray, not the test session's
    return subprocess.run(
        [str(PLATFORM), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def _rows(folder: Path, name: str) -> list[dict]:
    (sweep_dir,) = (folder / "runs").glob(f"{name}-*")
    return read_results(sweep_dir).to_pylist()


def test_own_workload_runs_from_its_folder_through_the_cli(tmp_path):
    folder = tmp_path / "byo"
    shutil.copytree(HERE / "byo", folder)
    done = _platform(
        ["sweep", "byo.yaml", "--set", "train.steps=4", "--set", "train.warmup_steps=1"], folder
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(folder, "byo")
    assert [(r["devices"], r["status"]) for r in rows] == [(1, "ok"), (2, "ok")], rows
    assert all(r["throughput"] > 0 for r in rows)
    # The 2-CPU default: the planner chose the resources and said so.
    assert "resources auto: cpus_per_device" in done.stdout


def test_platform_init_writes_a_sweep_that_runs_as_written(tmp_path):
    done = _platform(["init", "mine"], tmp_path)
    assert done.returncode == 0, done.stderr
    done = _platform(["sweep", "sweep.yaml"], tmp_path / "mine")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(tmp_path / "mine", "myworkload")
    assert [(r["devices"], r["status"]) for r in rows] == [(1, "ok"), (2, "ok")], rows


def test_a_sweep_without_resources_runs_1_and_2_devices_on_2_cpus(ray_cluster, tmp_path):
    """The tests' local Ray has 2 CPUs: `cpus_per_device: 1` (the old default) refused the
    2-device trial; `resources: auto` fits it, its input worker and the trial driver."""
    assert ray_cluster.cluster_resources()["CPU"] == 2
    spec = validate_spec(
        {
            "name": "auto",
            "workload": "mlp",
            "params": {"hidden": [16], "train_rows": 1024, "val_rows": 128},
            "train": {"steps": 4, "warmup_steps": 1},
            "grid": {"devices": [1, 2], "batch_size": [32]},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path / "runs", tracking=False)
    chosen = outcome.plan.spec.resources
    assert chosen.cpus_per_device < 1 and chosen.cpus_per_data_worker < 0.5
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert sorted((r["devices"], r["status"]) for r in rows) == [(1, "ok"), (2, "ok")], rows
