"""The `platform` command: one message and exit 2 for bad input, the command list, the old `sync`
name, `mlflow-push`'s refusals and failures, `plan --json`, and a plan that loads no Ray where
no cluster runs."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from amdahl.cli.commands import main
from amdahl.errors import UserError
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import SPEC_FILE
from amdahl.sweepdir.lock import lock_sweep_dir
from amdahl.sweepdir.table import append_rows
from amdahl.track.mlflow_store import FAIL_FAST_HTTP
from amdahl.track.tracker import Tracker

TINY = {
    "name": "tiny",
    "workload": "mlp",
    "params": {"hidden": [16], "train_rows": 256},
    "train": {"steps": 2, "warmup_steps": 1},
    "grid": {"devices": [1]},
}
COMMANDS = {"calibrate", "data", "init", "mlflow-push", "plan", "predict", "report", "sweep"}


def _spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def _sweep_dir(tmp_path: Path) -> Path:
    """A sweep directory as a driver leaves it: spec.yaml and one row."""
    path = tmp_path / "runs" / "tiny-20250101T120000Z"
    path.mkdir(parents=True)
    spec = validate_spec(TINY)
    (path / SPEC_FILE).write_text(yaml.safe_dump(spec.model_dump(), sort_keys=False))
    append_rows(path, [{"sweep": "tiny", "trial_id": "t1", "repeat": 0, "status": "ok"}])
    return path


def _one_error(result) -> str:
    """The output of a refused command: exactly one line, `error: ...`, and no traceback."""
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


# --------------------------------------------------------------------------- arguments


def test_help_lists_the_commands_and_hides_the_old_name():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    listed = result.output.split("Commands:", 1)[1].split()
    assert COMMANDS <= set(listed)
    assert "sync" not in listed


@pytest.mark.parametrize("command", ["plan", "sweep"])
def test_a_missing_sweep_file_is_one_message_and_exit_2(tmp_path, command):
    result = CliRunner().invoke(main, [command, str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml: cannot read sweep file" in _one_error(result)


@pytest.mark.parametrize(
    "override, says",
    [
        ("train.steps", "expected KEY.PATH=VALUE"),
        ("trian.steps=3", "unknown key 'trian' (did you mean 'train'?)"),
    ],
)
def test_a_bad_set_is_one_message_and_exit_2(tmp_path, override, says):
    result = CliRunner().invoke(main, ["plan", str(_spec_file(tmp_path)), "--set", override])
    assert result.exit_code == 2
    assert says in _one_error(result)


@pytest.mark.parametrize("command", ["mlflow-push", "sync"])
def test_a_directory_no_sweep_wrote_is_one_message_and_exit_2(tmp_path, command):
    result = CliRunner().invoke(main, [command, str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path}: not a sweep directory" in _one_error(result)
    assert not (tmp_path / "driver.lock").exists()


def test_plan_json_on_a_tiny_spec(tmp_path, no_cluster):
    result = CliRunner().invoke(main, ["plan", str(_spec_file(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert [n["name"] for n in plan["nodes"]] == ["local"]
    [trial] = plan["trials"]
    assert trial["settings"]["devices"] == 1 and trial["refused"] is None
    assert [launch["trials"] for launch in plan["launches"]] == [[trial["trial_id"]]]


def test_planning_loads_no_ray_where_no_cluster_runs(tmp_path):
    """`platform plan` where no Ray cluster runs (no RAY_ADDRESS, no record of `ray start`):
    the planner and the CLI's plan command plan for this machine without importing Ray at all
    (driver.sweep imports Ray Tune and Train, at module level)."""
    spec = _spec_file(tmp_path)
    probe = (
        "import sys\n"
        "from amdahl.driver.planning import plan_for\n"
        "from amdahl.spec.load import load_spec\n"
        "from amdahl.sweepdir.driver_files import plan_summary\n"
        "plan_summary(plan_for(load_spec(sys.argv[1])))\n"
        "from amdahl.cli.commands import main\n"
        "main(['plan', sys.argv[1], '--json'], standalone_mode=False)\n"
        "loaded = [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]\n"
        "print('loaded:', sorted(loaded))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)  # where `ray start` would have recorded a cluster
    out = subprocess.run(
        [sys.executable, "-c", probe, str(spec)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.strip().splitlines()[-1] == "loaded: []"


# --------------------------------------------------------------------------- mlflow-push


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A real SQLite MLflow store that `mlflow-push` pushes into, and none of MLflow's HTTP
    settings that the tracker sets for a push's duration."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for name in FAIL_FAST_HTTP:
        monkeypatch.delenv(name, raising=False)
    return uri


def _children(uri: str) -> list[str]:
    """The row keys of the child runs the store holds for the tiny sweep."""
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(TINY["name"])
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return sorted(r.data.tags["amdahl.row"] for r in runs if "mlflow.parentRunId" in r.data.tags)


@pytest.mark.parametrize("command", ["mlflow-push", "sync"])
def test_mlflow_push_pushes_the_rows_and_says_where_to_look(tmp_path, store, command):
    sweep_dir = _sweep_dir(tmp_path)
    result = CliRunner().invoke(main, [command, str(sweep_dir)])
    assert result.exit_code == 0, result.output
    experiment = MlflowClient(tracking_uri=store).get_experiment_by_name(TINY["name"])
    page = f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    assert result.stdout.splitlines() == [
        "1 rows pushed to MLflow, 0 were already there",
        f"MLflow: mlflow ui --backend-store-uri {store}",
        f"        then open http://127.0.0.1:5000/{page}",
    ]
    assert _children(store) == ["t1:0"]
    again = CliRunner().invoke(main, [command, str(sweep_dir)])
    assert again.stdout.splitlines()[0] == "0 rows pushed to MLflow, 1 were already there"
    assert _children(store) == ["t1:0"]


def test_mlflow_push_is_refused_while_a_driver_writes_the_directory(tmp_path, store):
    sweep_dir = _sweep_dir(tmp_path)
    with lock_sweep_dir(sweep_dir):
        result = CliRunner().invoke(main, ["mlflow-push", str(sweep_dir)])
    assert result.exit_code == 2
    assert "is in use by another sweep driver (pid " in _one_error(result)
    assert _children(store) == []


def test_a_driver_is_refused_while_a_push_holds_the_directory(tmp_path, store, monkeypatch):
    sweep_dir = _sweep_dir(tmp_path)
    sync = Tracker.sync

    def sync_meanwhile(self, rows):  # a second driver starts while the push runs
        with pytest.raises(UserError, match="in use by another MLflow push"):
            lock_sweep_dir(sweep_dir)
        return sync(self, rows)

    monkeypatch.setattr(Tracker, "sync", sync_meanwhile)
    assert CliRunner().invoke(main, ["mlflow-push", str(sweep_dir)]).exit_code == 0
    assert _children(store) == ["t1:0"]
    lock_sweep_dir(sweep_dir).release()  # and let go after it


def test_an_error_that_is_no_outage_exits_1_with_one_message(tmp_path, store, caplog):
    """The sweep's experiment was deleted in the store: MLflow refuses runs in it, which no
    waiting fixes."""
    sweep_dir = _sweep_dir(tmp_path)
    client = MlflowClient(tracking_uri=store)
    client.delete_experiment(client.create_experiment(TINY["name"]))
    with caplog.at_level(logging.DEBUG, logger="amdahl.track.tracker"):
        result = CliRunner().invoke(main, ["mlflow-push", str(sweep_dir)])
    assert result.exit_code == 1
    line = _one_error(result)
    assert "error: pushing to MLflow failed (logging row t1:0: MlflowException" in line
    assert f"`platform mlflow-push {sweep_dir}` pushes what MLflow lacks" in line
    said = [r for r in caplog.records if r.name == "amdahl.track.tracker"]
    assert not [r for r in said if r.levelno >= logging.WARNING]  # said once, by the command


def test_an_outage_exits_2_saying_nothing_is_lost(tmp_path, store, monkeypatch):
    """A tracking server on a port where nothing listens: the connection is refused."""
    sweep_dir = _sweep_dir(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    result = CliRunner().invoke(main, ["mlflow-push", str(sweep_dir)])
    assert result.exit_code == 2
    line = _one_error(result)
    assert line.startswith("error: MLflow unreachable: ") and "; nothing lost" in line
    assert f"`platform mlflow-push {sweep_dir}` again" in line
