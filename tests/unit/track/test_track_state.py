"""tracking.json records which rows each tracking store holds, keyed by the store's URI and the
experiment: a sweep directory copied elsewhere (rsynced down from a cluster) syncs in full to
another store, and back to the first without duplicates. A tracking.json from before the key
(no `version`) stays readable: its entries belong to an unknown store, which a sync matches by
the parent run id before looking rows up by their tags, so nothing is pushed twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import TRACKING_FILE
from amdahl.track.mlflow_store import store_key
from amdahl.track.tracker import Tracker

EXPERIMENT = "copied"


def _row(trial_id: str, status: str = "ok") -> dict:
    return {
        "sweep": "copied",
        "trial_id": trial_id,
        "repeat": 0,
        "launch_id": "L0",
        "workload": "mlp",
        "params": json.dumps({"hidden": [32]}),
        "devices": 1,
        "batch_size": 32,
        "precision": "fp32",
        "compile": "eager",
        "sync": "ddp",
        "status": status,
        "throughput": 100.0,
    }


ROWS = [_row("a"), _row("b")]


def _sync(sweep_dir: Path, uri: str, monkeypatch, rows=ROWS) -> int:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spec = validate_spec(
        {"name": "copied", "workload": "mlp", "tracking": {"experiment": EXPERIMENT}}
    )
    tracker = Tracker(spec, sweep_dir)
    pushed = tracker.sync(rows)
    assert tracker.offline_reason is None and tracker.error is None
    return pushed


def _runs(uri: str) -> tuple[list, list]:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


@pytest.fixture
def stores(tmp_path):
    return (f"sqlite:///{tmp_path / 'cluster.db'}", f"sqlite:///{tmp_path / 'laptop.db'}")


def test_a_copied_sweep_directory_syncs_in_full_to_another_store(tmp_path, stores, monkeypatch):
    cluster, laptop = stores
    on_cluster = tmp_path / "cluster" / "copied-1"
    on_cluster.mkdir(parents=True)
    assert _sync(on_cluster, cluster, monkeypatch) == 2

    copy = tmp_path / "laptop" / "copied-1"
    shutil.copytree(on_cluster, copy)
    assert _sync(copy, laptop, monkeypatch) == 2  # was 0: "already logged", but elsewhere
    parents, children = _runs(laptop)
    assert len(parents) == 1 and sorted(c.data.tags["amdahl.row"] for c in children) == [
        "a:0",
        "b:0",
    ]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}

    assert _sync(copy, laptop, monkeypatch) == 0  # idempotent per store
    assert _sync(copy, cluster, monkeypatch) == 0  # and still known to the first store
    for uri in stores:
        parents, children = _runs(uri)
        assert (len(parents), len(children)) == (1, 2)

    state = json.loads((copy / TRACKING_FILE).read_text())
    assert state["version"] == 2
    assert sorted(e["store"] for e in state["stores"]) == sorted(store_key(u) for u in stores)


def test_an_old_unkeyed_state_is_matched_to_its_store_by_the_parent_run(
    tmp_path, stores, monkeypatch
):
    cluster, laptop = stores
    sweep_dir = tmp_path / "copied-1"
    sweep_dir.mkdir()
    assert _sync(sweep_dir, cluster, monkeypatch, ROWS[:1]) == 1
    (entry,) = json.loads((sweep_dir / TRACKING_FILE).read_text())["stores"]
    old = {k: entry[k] for k in ("parent_run_id", "experiment_id", "logged")}
    (sweep_dir / TRACKING_FILE).write_text(json.dumps(old))  # the layout before the key

    # Its own store: the old parent is found, only the new row is pushed, nothing twice.
    assert _sync(sweep_dir, cluster, monkeypatch) == 1
    parents, children = _runs(cluster)
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.run_id == old["parent_run_id"]

    # Any other store: everything.
    (sweep_dir / TRACKING_FILE).write_text(json.dumps(old))
    assert _sync(sweep_dir, laptop, monkeypatch) == 2
    assert [len(x) for x in _runs(laptop)] == [1, 2]


def test_the_same_store_under_another_uri_is_not_pushed_twice(tmp_path, stores, monkeypatch):
    cluster, _ = stores
    sweep_dir = tmp_path / "copied-1"
    sweep_dir.mkdir()
    assert _sync(sweep_dir, cluster, monkeypatch) == 2
    (tmp_path / "alias").symlink_to(tmp_path)  # e.g. a server behind a tunnel's other address
    alias = f"sqlite:///{tmp_path / 'alias' / 'cluster.db'}"
    assert store_key(alias) != store_key(cluster)
    assert _sync(sweep_dir, alias, monkeypatch) == 0
    assert [len(x) for x in _runs(cluster)] == [1, 2]


def test_rows_are_found_by_their_tags_when_the_state_is_lost(tmp_path, stores, monkeypatch):
    cluster, _ = stores
    sweep_dir = tmp_path / "copied-1"
    sweep_dir.mkdir()
    assert _sync(sweep_dir, cluster, monkeypatch) == 2
    (sweep_dir / TRACKING_FILE).unlink()  # moved aside, as the corrupt-state message says
    assert _sync(sweep_dir, cluster, monkeypatch, [*ROWS, _row("c")]) == 1
    parents, children = _runs(cluster)
    assert len(parents) == 1 and len(children) == 3


def test_store_keys_carry_no_credentials_and_name_local_stores_absolutely(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert store_key("http://u:pw@MLflow.Example:5000/") == "http://mlflow.example:5000"
    assert store_key("https://token@host/prefix") == "https://host/prefix"
    assert store_key("sqlite:///mlflow.db") == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert store_key(f"sqlite:///{tmp_path}/x.db?timeout=5") == f"sqlite:///{tmp_path}/x.db"
    assert store_key("mlruns") == f"file://{tmp_path / 'mlruns'}"
    assert store_key("postgresql://u:pw@db:5432/mlflow") == "postgresql://db:5432/mlflow"
