"""A tiny sweep end to end on local Ray: rows in results.parquet, runs in MLflow, CLI exit codes."""

import subprocess
import sys
from pathlib import Path

import pytest

from amdahl import read_results, run_sweep, validate_spec
from amdahl.driver.events import Planned, RayConnected, SweepFinished, TrialDone

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

TINY = {
    "name": "tiny",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
    "train": {"steps": 8, "warmup_steps": 2},
    "grid": {"devices": [1, 2], "batch_size": [32], "sync": ["ddp", "none"]},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
}


@pytest.fixture(scope="module")
def tiny_sweep(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    mp = pytest.MonkeyPatch()
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    events = []
    outcome = run_sweep(
        validate_spec(TINY),
        runs_dir=tmp / "runs",
        on_event=lambda event: events.append(type(event)),
    )
    mp.undo()
    return outcome, uri, events


def test_every_trial_has_one_ok_row_with_positive_throughput(tiny_sweep):
    outcome, _, events = tiny_sweep
    table = read_results(outcome.sweep_dir)
    rows = table.to_pylist()
    assert len(rows) == 4
    assert {r["trial_id"] for r in rows} == {t.trial_id for t in outcome.plan.trials}
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["throughput"] > 0
        assert r["step_time_s"] > 0
        assert r["global_batch"] == 32 * r["devices"]
        assert r["measured_s"] > 0 and r["setup_s"] >= 0
        assert 0.0 <= r["val_accuracy"] <= 1.0
    assert sorted(set(r["launch_id"] for r in rows)) == sorted(
        launch.launch_id for launch in outcome.plan.launches()
    )
    # Ray first (which cluster, what it has), then the plan, ..., then the end.
    assert events[:2] == [RayConnected, Planned] and events[-1] is SweepFinished
    assert events.count(TrialDone) == 4
    for name in ("spec.yaml", "plan.json", "results.parquet"):
        assert (outcome.sweep_dir / name).exists()


def test_mlflow_holds_parent_and_child_runs(tiny_sweep):
    from mlflow.tracking import MlflowClient

    outcome, uri, _ = tiny_sweep
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("amdahl.kind") == "sweep"]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 4
    rows = {r["trial_id"]: r for r in read_results(outcome.sweep_dir).to_pylist()}
    for child in children:
        row = rows[child.data.params["trial_id"]]
        assert child.data.params["devices"] == str(row["devices"])
        assert child.data.params["sync"] == row["sync"]
        assert child.data.metrics["throughput"] == pytest.approx(row["throughput"])
        assert child.data.tags["amdahl.status"] == "ok"
        assert child.info.status == "FINISHED"
    artifacts = [a.path for a in client.list_artifacts(parents[0].info.run_id)]
    assert "spec.yaml" in artifacts and "results.parquet" in artifacts


def test_report_command_prints_speedup(tiny_sweep):
    outcome, _, _ = tiny_sweep
    done = subprocess.run(
        [sys.executable, "-m", "amdahl.cli.commands", "report", str(outcome.sweep_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "speedup" in done.stdout.lower()


def test_plan_refuses_more_devices_than_the_machine_has(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\nworkload: mlp\ngrid:\n  devices: [64]\n")
    done = subprocess.run(
        [sys.executable, "-m", "amdahl.cli.commands", "plan", str(spec)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "d64 b256 fp32 eager w1 ddp" in out
    assert "64 x (1 CPU)" in out and "CPUs" in out
    assert "Traceback" not in out


def test_bad_sweep_file_exits_2_with_one_message(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nworkload: mlp\ngrid:\n  devices: [1, 0]\n")
    done = subprocess.run(
        [sys.executable, "-m", "amdahl.cli.commands", "sweep", str(spec)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {spec}:4: grid.devices[1]: must be >= 1, got 0"
    assert not (ROOT / "runs").exists() or not any((ROOT / "runs").glob("bad-*"))


def test_time_to_target_sweep_with_linear_lr_scaling(ray_cluster, tmp_path):
    """train.target and train.lr_scaling reach the workers: each row records the scaled rate
    and when validation met the target; the report ranks the configurations by it."""
    spec = validate_spec(
        {
            "name": "ttt",
            "workload": "mlp",
            "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
            "train": {
                "warmup_steps": 2,
                "lr": 0.05,
                "lr_scaling": "linear",
                "lr_base_batch": 32,
                "lr_warmup_steps": 4,
                "target": {
                    "metric": "val_accuracy",
                    "value": 0.6,
                    "max_steps": 300,
                    "eval_every": 5,
                },
            },
            "grid": {"devices": [1], "batch_size": [32, 64], "sync": ["none"]},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
            "tracking": {"enabled": False},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path)
    rows = {r["batch_size"]: r for r in read_results(outcome.sweep_dir).to_pylist()}
    for batch, row in rows.items():
        assert row["status"] == "ok", row["error"]
        assert row["target"] == "val_accuracy>=0.6"
        assert row["lr"] == pytest.approx(0.05 * batch / 32)
        assert row["steps_to_target"] is not None, "the teacher MLP task reaches 60% quickly"
        assert (row["steps_to_target"] - 2) % 5 == 0  # checked every 5 steps after warmup
        assert row["steps"] == row["steps_to_target"] - 2
        assert row["time_to_target_s"] > 0 and row["val_accuracy"] >= 0.6
    report = (outcome.sweep_dir / "report.md").read_text()
    assert "## Time to target" in report


def test_a_later_sweep_on_the_same_cluster_shape_reuses_the_calibration(tiny_sweep):
    """The tiny sweep's 2-device ddp trials made it measure the all-reduce; a later sweep in
    the same runs directory, whose widest group has the same shape, writes that measurement
    into its own calibration.json (saying where from) instead of measuring again."""
    import json

    from amdahl.driver.events import Calibrating, CalibrationReused

    first, _, events = tiny_sweep
    assert Calibrating in events and CalibrationReused not in events
    assert first.calibration_s > 0 and first.calibration_reused_from is None
    measured = json.loads((first.sweep_dir / "calibration.json").read_text())
    later_events = []
    spec = {**TINY, "name": "later", "grid": {**TINY["grid"], "devices": [2], "sync": ["ddp"]}}
    later = run_sweep(
        validate_spec(spec),
        runs_dir=first.sweep_dir.parent,
        tracking=False,
        on_event=lambda event: later_events.append(event),
    )
    assert [r["status"] for r in later.rows] == ["ok"]
    kinds = [type(e) for e in later_events]
    assert CalibrationReused in kinds and Calibrating not in kinds
    assert later.calibration_s == 0.0
    assert later.calibration_reused_from == str(first.sweep_dir.resolve())
    reused = json.loads((later.sweep_dir / "calibration.json").read_text())
    assert reused["reused_from"]["sweep_dir"] == str(first.sweep_dir.resolve())
    assert measured["all_reduce"] and measured["alpha_s"] > 0
    for key in ("alpha_s", "bandwidth_Bps", "all_reduce", "peak_flops", "devices"):
        assert reused[key] == measured[key], key
    assert reused["reused_from"]["measured_at"] <= reused["created_at"]  # measured, then written
    assert reused["grad_bytes"] > 0  # of this sweep's model, computed here
