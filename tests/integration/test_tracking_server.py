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
from amdahl.driver.sweep import SweepOutcome

pytestmark = pytest.mark.integration

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
        [sys.executable, "-m", "amdahl.cli.commands", "sync", str(sweep_dir)],
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


# ---- what MLflow's UI draws: per-step curves, scaling curves, the runs table -----------------

CURVES_EXPERIMENT = "served-curves"
CURVES_SPEC: dict[str, Any] = {
    **SPEC,
    "name": "curves",
    "grid": {"devices": [1, 2], "batch_size": [32], "sync": ["ddp"]},
}


def _find_chromium() -> str | None:
    import shutil

    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")


CHROMIUM = _find_chromium()
#: Text only MLflow's GenAI overview shows (traces, token usage), not its runs table.
GENAI_OVERVIEW = ("Token Usage", "Tokens per Trace")


@dataclass
class Curves:
    base: str
    experiment: dict[str, Any]
    outcome: SweepOutcome
    parent: Run
    children: list[Run]


@pytest.fixture(scope="module")
def curves(served: Served, tmp_path_factory) -> Curves:
    """A sweep over 1 and 2 devices against the same server, in an experiment of its own."""
    tmp = tmp_path_factory.mktemp("curves")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        spec = validate_spec(
            {**CURVES_SPEC, "tracking": {"uri": served.base, "experiment": CURVES_EXPERIMENT}}
        )
        outcome = run_sweep(spec, runs_dir=tmp / "runs")
    experiment = _call(
        served.base,
        "/api/2.0/mlflow/experiments/get-by-name?"
        + urllib.parse.urlencode({"experiment_name": CURVES_EXPERIMENT}),
    )["experiment"]
    runs = _search_runs(served.base, experiment["experiment_id"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.tags]
    assert len(parents) == 1, [r.tags for r in runs]
    children = [r for r in runs if "mlflow.parentRunId" in r.tags]
    return Curves(served.base, experiment, outcome, parents[0], children)


def _history(base: str, run_id: str, key: str) -> dict[int, float]:
    """A metric's history as {step: value} (every step once)."""
    page = _call(
        base,
        "/api/2.0/mlflow/metrics/get-history?"
        + urllib.parse.urlencode({"run_id": run_id, "metric_key": key}),
    )
    points = page.get("metrics", [])
    steps = [int(p.get("step", 0)) for p in points]
    assert len(steps) == len(set(steps)), f"{key}: a step logged twice: {sorted(steps)}"
    return {int(p.get("step", 0)): p["value"] for p in points}


def test_experiments_amdahl_uses_are_tagged_as_model_training(served: Served, curves: Curves):
    for name in (EXPERIMENT, CURVES_EXPERIMENT):
        experiment = _call(
            served.base,
            "/api/2.0/mlflow/experiments/get-by-name?"
            + urllib.parse.urlencode({"experiment_name": name}),
        )["experiment"]
        assert _pairs(experiment.get("tags"))["mlflow.experimentKind"] == "custom_model_development"


def test_child_runs_carry_per_step_loss_step_time_and_data_wait(curves: Curves):
    rows = {r["trial_id"]: r for r in read_results(curves.outcome.sweep_dir).to_pylist()}
    assert len(curves.children) == len(rows) == 2
    assert all(r["status"] == "ok" for r in rows.values()), [r["error"] for r in rows.values()]
    total = SPEC["train"]["warmup_steps"] + SPEC["train"]["steps"]
    for child in curves.children:
        row = rows[child.params["trial_id"]]
        history = json.loads(row["history"])
        assert history["step"] == list(range(1, total + 1))  # fewer than the limit: all kept
        for series, key in (
            ("loss", "train/loss"),
            ("step_time_s", "train/step_time_s"),
            ("data_wait_s", "train/data_wait_s"),
        ):
            logged = _history(curves.base, child.run_id, key)
            assert sorted(logged) == history["step"], key
            assert [logged[s] for s in history["step"]] == pytest.approx(history[series])
        assert all(v > 0 for v in _history(curves.base, child.run_id, "train/step_time_s").values())
        # The summary metrics keep their own names: the table shows the row's figures.
        assert child.metrics["step_time_s"] == pytest.approx(row["step_time_s"])
        assert child.metrics["final_loss"] == pytest.approx(row["final_loss"])


def test_the_parent_run_draws_scaling_curves_against_the_device_count(curves: Curves):
    from amdahl.report import build_report
    from amdahl.track.parent_run import metric_names

    report = build_report(curves.outcome.sweep_dir)
    assert len(report.curves) == 1
    (name,) = metric_names([c.label for c in report.curves])
    assert name == report.curves[0].label  # e.g. "b32 fp32 eager w1 ddp": nothing to replace
    parent = curves.parent
    throughput = _history(curves.base, parent.run_id, f"throughput/{name}")
    speedup = _history(curves.base, parent.run_id, f"speedup/{name}")
    efficiency = _history(curves.base, parent.run_id, f"efficiency/{name}")
    assert sorted(throughput) == sorted(speedup) == sorted(efficiency) == [1, 2]
    for point in report.curves[0].points:
        assert throughput[point.devices] == pytest.approx(point.config.throughput.median)
        assert speedup[point.devices] == pytest.approx(point.speedup.median)
        assert efficiency[point.devices] == pytest.approx(point.efficiency)
    assert speedup[1] == pytest.approx(1.0)
    best = report.recommendation.picks[0].config
    assert parent.metrics["best/throughput"] == pytest.approx(best.throughput.median)
    assert parent.metrics["best/devices"] == best.devices
    assert parent.tags["amdahl.best"] == best.label
    listing = _call(
        curves.base,
        "/api/2.0/mlflow/artifacts/list?" + urllib.parse.urlencode({"run_id": parent.run_id}),
    )
    assert {"report.md", "report.html"} <= {f["path"] for f in listing.get("files", [])}


def _page_text(url: str, profile: Path) -> str:
    """The page's text once headless Chromium has run its scripts (20 s of virtual time)."""
    import html
    import re
    import subprocess

    profile.mkdir(parents=True)
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "--virtual-time-budget=20000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", done.stdout, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
def test_the_experiment_opens_on_its_runs_table_in_a_browser(curves: Curves, tmp_path):
    """MLflow 3.17's UI takes its view from the sidebar's "GenAI | Model training" switch (kept
    by the browser, GenAI in a new one), which `workflowType` in the URL sets: docs/mlflow.md's
    link opens the runs table, with the sweep's parent run, and sorted by throughput every trial."""
    page = f"{curves.base}/#/experiments/{curves.experiment['experiment_id']}/runs"
    table = _page_text(f"{page}?workflowType=machine_learning", tmp_path / "a")
    assert not [t for t in GENAI_OVERVIEW if t in table], table[:2000]
    assert curves.outcome.sweep_dir.name in table, table[:2000]  # the parent run's name
    assert f"{len(curves.children) + 1} matching runs" in table, table[:2000]

    ranked = _page_text(
        f"{page}?workflowType=machine_learning&orderByKey=metrics.%60throughput%60"
        "&orderByAsc=false",
        tmp_path / "b",
    )
    assert not [t for t in GENAI_OVERVIEW if t in ranked], ranked[:2000]
    names = [c.tags["mlflow.runName"] for c in curves.children]
    assert all(name in ranked for name in names), (names, ranked[:2000])
    assert curves.outcome.sweep_dir.name in ranked
