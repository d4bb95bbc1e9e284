"""A sweep tracked by a real `mlflow server`, read back over plain HTTP.

The other MLflow tests use a SQLite file store that the driver writes directly. Users on a
cluster point `tracking.uri` at a tracking server instead, and the server proxies artifact
uploads. This test starts that server (a child process it owns, bound to 127.0.0.1 on a free
port, artifacts served through it), runs a tiny sweep against it with `tracking.uri`, and reads
everything back through the REST API only (no MLflow client), as any other tool would: one parent
run, one child run per trial with its settings, throughput and row key, and the report files
downloadable from the server.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow_server import free_port, start_mlflow, stop

from amdahl import read_results, run_sweep, validate_spec
from amdahl.run import SweepOutcome

EXPERIMENT = "served"
SPEC: dict[str, Any] = {
    "name": "served",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
    "train": {"steps": 8, "warmup_steps": 2},
    "grid": {"devices": [1], "batch_size": [32, 64], "sync": ["ddp"]},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
}


# ---- plain HTTP reads ---------------------------------------------------------------------


def _call(base: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET `path` (query included), or POST `body` as JSON; the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _pairs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    """MLflow's `[{key, value}, ...]` lists as a dict."""
    return {item["key"]: item["value"] for item in items or []}


@dataclass
class Run:
    run_id: str
    status: str
    artifact_uri: str
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]


def _search_runs(base: str, experiment_id: str) -> list[Run]:
    runs: list[Run] = []
    token: str | None = None
    while True:
        body: dict[str, Any] = {"experiment_ids": [experiment_id], "max_results": 100}
        if token:
            body["page_token"] = token
        page = _call(base, "/api/2.0/mlflow/runs/search", body)
        for r in page.get("runs", []):
            data = r.get("data", {})
            runs.append(
                Run(
                    run_id=r["info"]["run_id"],
                    status=r["info"]["status"],
                    artifact_uri=r["info"]["artifact_uri"],
                    params=_pairs(data.get("params")),
                    metrics=_pairs(data.get("metrics")),
                    tags=_pairs(data.get("tags")),
                )
            )
        token = page.get("next_page_token")
        if not token:
            return runs


# ---- one sweep against one server, shared by the tests ------------------------------------


@dataclass
class Served:
    base: str
    store: Path
    outcome: SweepOutcome
    parent: Run
    children: list[Run]


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("served")
    store = tmp / "mlflow"
    store.mkdir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_mlflow(port, store)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # the sweep file's uri is used
            spec = validate_spec({**SPEC, "tracking": {"uri": base, "experiment": EXPERIMENT}})
            outcome = run_sweep(spec, runs_dir=tmp / "runs")
        experiment = _call(
            base,
            "/api/2.0/mlflow/experiments/get-by-name?"
            + urllib.parse.urlencode({"experiment_name": EXPERIMENT}),
        )["experiment"]
        runs = _search_runs(base, experiment["experiment_id"])
        parents = [r for r in runs if "mlflow.parentRunId" not in r.tags]
        assert len(parents) == 1, [r.tags for r in runs]
        children = [r for r in runs if r.tags.get("mlflow.parentRunId") == parents[0].run_id]
        assert len(children) + 1 == len(runs)  # nothing else in the experiment
        yield Served(base, store, outcome, parents[0], children)
    finally:
        stop(server)


def test_one_parent_and_one_child_run_per_trial_with_settings_and_metrics(served: Served):
    rows = {r["trial_id"]: r for r in read_results(served.outcome.sweep_dir).to_pylist()}
    assert len(rows) == 2
    assert all(r["status"] == "ok" for r in rows.values()), [r["error"] for r in rows.values()]
    assert served.parent.tags["amdahl.kind"] == "sweep"
    assert served.parent.status == "FINISHED"
    assert served.parent.tags["mlflow.runName"] == served.outcome.sweep_dir.name

    assert sorted(c.params["trial_id"] for c in served.children) == sorted(rows)
    for child in served.children:
        row = rows[child.params["trial_id"]]
        assert child.tags["amdahl.row"] == f"{row['trial_id']}:{row['repeat']}"
        assert child.params["batch_size"] == str(row["batch_size"])
        assert child.params["devices"] == str(row["devices"]) == "1"
        assert child.params["sync"] == row["sync"] == "ddp"
        assert child.metrics["throughput"] > 0
        assert child.metrics["throughput"] == pytest.approx(row["throughput"])
        assert child.tags["amdahl.status"] == "ok"
        assert child.status == "FINISHED"
    assert sorted(int(c.params["batch_size"]) for c in served.children) == [32, 64]


def test_report_artifacts_are_uploaded_through_the_server_and_downloadable(served: Served):
    parent = served.parent
    listing = _call(
        served.base,
        "/api/2.0/mlflow/artifacts/list?" + urllib.parse.urlencode({"run_id": parent.run_id}),
    )
    names = {f["path"] for f in listing.get("files", [])}
    assert {"report.md", "report.html", "spec.yaml"} <= names, names

    # Proxied artifact storage: the client uploaded over HTTP into the server's destination.
    assert parent.artifact_uri.startswith("mlflow-artifacts:/"), parent.artifact_uri
    relative = parent.artifact_uri.removeprefix("mlflow-artifacts:").strip("/")
    stored = served.store / "artifacts" / relative
    assert (stored / "report.md").is_file()

    local = served.outcome.sweep_dir / "report.md"
    proxied = _get_text(f"{served.base}/api/2.0/mlflow-artifacts/artifacts/{relative}/report.md")
    assert proxied == local.read_text()
    by_run = _get_text(
        f"{served.base}/get-artifact?"
        + urllib.parse.urlencode({"path": "report.md", "run_uuid": parent.run_id})
    )
    assert by_run == local.read_text()
    html = _get_text(f"{served.base}/api/2.0/mlflow-artifacts/artifacts/{relative}/report.html")
    assert html == (served.outcome.sweep_dir / "report.html").read_text()


# ---- a copied sweep directory syncs to another server ----------------------------------------


def _sync_cli(sweep_dir: Path, uri: str) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-m", "amdahl.cli", "sync", str(sweep_dir)],
        env=env,
        capture_output=True,
        text=True,
        cwd=sweep_dir.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr
    return done.stdout.strip()


def _runs_of(base: str) -> tuple[list[Run], list[Run]]:
    experiment = _call(
        base,
        "/api/2.0/mlflow/experiments/get-by-name?"
        + urllib.parse.urlencode({"experiment_name": EXPERIMENT}),
    )["experiment"]
    runs = _search_runs(base, experiment["experiment_id"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.tags]
    return parents, [r for r in runs if "mlflow.parentRunId" in r.tags]


def test_a_copied_sweep_directory_syncs_in_full_to_another_server(served: Served, tmp_path):
    """A sweep directory rsynced down from the cluster and synced to the laptop's own server
    pushes every row there, and nothing twice to either server. The laptop's URI carries a
    password (in the environment, where it may): it is never printed or written."""
    import shutil

    copy = tmp_path / served.outcome.sweep_dir.name
    shutil.copytree(served.outcome.sweep_dir, copy)
    store = tmp_path / "laptop-mlflow"
    store.mkdir()
    port = free_port()
    laptop = f"http://127.0.0.1:{port}"
    server = start_mlflow(port, store)
    try:
        assert _sync_cli(copy, f"http://alice:s3cr3t@127.0.0.1:{port}").startswith("2 rows pushed")
        assert "s3cr3t" not in (copy / "tracking.json").read_text()
        parents, children = _runs_of(laptop)
        assert len(parents) == 1 and parents[0].tags["amdahl.kind"] == "sweep"
        assert sorted(c.params["trial_id"] for c in children) == sorted(
            c.params["trial_id"] for c in served.children
        )
        assert {c.tags["mlflow.parentRunId"] for c in children} == {parents[0].run_id}
        assert _sync_cli(copy, laptop).startswith("0 rows pushed")
    finally:
        stop(server)
    assert _sync_cli(copy, served.base).startswith("0 rows pushed")  # the cluster's has them
    parents, children = _runs_of(served.base)
    assert [p.run_id for p in parents] == [served.parent.run_id]
    assert len(children) == len(served.children)
