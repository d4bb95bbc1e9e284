"""What users find on the runs in a real SQLite MLflow store: numeric settings that filter and
sort as numbers (`metrics.devices >= 2`), each child's configuration label (the report's own,
so grouping by it gathers a configuration's repeats) and sweep, who ran it and from what (user,
source, git commit), the experiment's and the sweep's descriptions, per-step points stamped when
their step ended, and the link that opens the runs table."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from report_rows import row, scaling_rows, write_sweep

from amdahl.report import build_report
from amdahl.report.build import report_from_rows
from amdahl.spec.load import load_spec, validate_spec
from amdahl.track.child_run import CONFIG_TAG, NUMERIC_SETTINGS, SWEEP_TAG
from amdahl.track.mlflow_store import NOTE_TAG
from amdahl.track.run_source import git_commit, login_user
from amdahl.track.tracker import Tracker
from amdahl.track.ui_link import tracking_link

EXPERIMENT = "runs"
STARTED = "2026-01-02T03:04:05+00:00"
STARTED_MS = 1767323045000


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _rows() -> list[dict]:
    """scaling_rows with two repeats each, a trial start, setup time and per-step history."""
    rows = []
    for r in scaling_rows():
        for repeat in (0, 1):
            history = {
                "step": [1, 2, 3],
                "loss": [3.0, 2.0, 1.0],
                "step_time_s": [0.5, 0.1, 0.1],
                "data_wait_s": [0.0, 0.05, 0.05],
                "elapsed_s": [0.5, 0.65, 0.8],
            }
            rows.append(
                {
                    **r,
                    "repeat": repeat,
                    "throughput": r["throughput"] * (1 + repeat / 100),
                    "started_at": STARTED,
                    "setup_s": 2.0,
                    "compile_cache": "cold",
                    "nodes": json.dumps(["node-a"] * r["devices"]),
                    "history": json.dumps(history),
                }
            )
    return rows


def _sweep(tmp_path: Path, rows: list[dict], spec: dict | None = None) -> tuple[Tracker, Path]:
    spec = spec or {"name": "runs", "workload": "mlp", "tracking": {"experiment": EXPERIMENT}}
    sweep_dir = write_sweep(tmp_path / "runs-20260102T030405Z", rows, spec=spec)
    return Tracker(validate_spec(spec), sweep_dir), sweep_dir


def _finish(tracker: Tracker, rows: list[dict]) -> None:
    tracker.finish(SimpleNamespace(rows=rows, wall_s=1.0, failed=[]))
    assert tracker.error is None and tracker.offline_reason is None, tracker.error


def _runs(uri: str) -> tuple[object, list]:
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parent, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def test_numeric_settings_filter_as_numbers(store, tmp_path):
    rows = _rows()
    tracker, _ = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    experiment = MlflowClient().get_experiment_by_name(EXPERIMENT).experiment_id
    found = mlflow.search_runs([experiment], filter_string="metrics.devices >= 2")
    multi = sorted(f"{r['trial_id']}:{r['repeat']}" for r in rows if r["devices"] >= 2)
    assert sorted(found["tags.amdahl.row"]) == multi
    # as a number, 4 sorts after 2 and the global batch compares as one
    wide = mlflow.search_runs([experiment], filter_string="metrics.global_batch > 300")
    assert set(wide["metrics.devices"]) == {4.0}
    _, children = _runs(store)
    for child in children:
        metrics, params = child.data.metrics, child.data.params
        for name in ("devices", "batch_size", "global_batch", "steps"):
            assert metrics[name] == float(params[name])  # a metric and still a param
        assert set(NUMERIC_SETTINGS) >= {"data_workers", "micro_steps"}


def test_each_child_is_tagged_with_the_reports_label_and_its_sweep(store, tmp_path):
    rows = _rows()
    tracker, sweep_dir = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    _, children = _runs(store)
    report = report_from_rows(rows)
    by_key = {f"{r['trial_id']}:{r['repeat']}": c.label for c in report.configs for r in c.rows}
    assert {c.data.tags["amdahl.row"]: c.data.tags[CONFIG_TAG] for c in children} == by_key
    # grouped by the tag, each configuration holds its two repeats
    groups: dict[str, int] = {}
    for child in children:
        groups[child.data.tags[CONFIG_TAG]] = groups.get(child.data.tags[CONFIG_TAG], 0) + 1
    assert sorted(groups) == sorted(c.label for c in report.configs)
    assert set(groups.values()) == {2}
    assert {c.data.tags[SWEEP_TAG] for c in children} == {sweep_dir.name}
    for child in children:
        assert child.data.params["compile_cache"] == "cold"
        assert json.loads(child.data.params["nodes"]) == ["node-a"] * int(
            child.data.params["devices"]
        )


def test_a_label_that_only_the_whole_sweep_decides_is_the_reports_at_the_end(store, tmp_path):
    """The grid declares no `params.hidden` axis, yet the rows differ in it (rows of an earlier
    spec): as the rows arrive each is labelled without it, and at the end with the report's
    label, which names it."""
    rows = [
        {**r, "params": json.dumps({"hidden": [h]})}
        for r in _rows()[:4]
        for h in (16, 32)
        if r["repeat"] == 0
    ]
    for i, r in enumerate(rows):
        r["trial_id"] = f"t{i}"
    tracker, _ = _sweep(tmp_path, rows)
    for r in rows:
        assert tracker.log_trial(r)
    _, children = _runs(store)
    assert not any("hidden" in c.data.tags[CONFIG_TAG] for c in children)
    _finish(tracker, rows)
    _, children = _runs(store)
    labels = {c.data.tags["amdahl.row"]: c.data.tags[CONFIG_TAG] for c in children}
    report = report_from_rows(rows)
    assert labels == {f"{r['trial_id']}:0": c.label for c in report.configs for r in c.rows}
    assert all("hidden=" in label for label in labels.values())


def test_a_grid_axis_is_in_the_label_as_each_row_arrives(store, tmp_path):
    """A sweep over `prefetch_batches` labels its first row `p4` (the default, which a label
    names only when the sweep varies the axis), as the report will once `p1` is in too."""
    spec = {
        "name": "runs",
        "workload": "mlp",
        "tracking": {"experiment": EXPERIMENT},
        "grid": {"prefetch_batches": [1, 4]},
    }
    rows = [row(1, prefetch_batches=p, trial_id=f"p{p}", started_at=STARTED) for p in (1, 4)]
    tracker, _ = _sweep(tmp_path, rows, spec)
    assert tracker.log_trial(rows[1])  # p4 arrives first
    _, children = _runs(store)
    expected = {c.rows[0]["trial_id"]: c.label for c in report_from_rows(rows).configs}
    assert expected["p4"].endswith(" p4")
    assert children[0].data.tags[CONFIG_TAG] == expected["p4"]
    assert tracker._logged["p4:0"]["config"] == expected["p4"]


def test_runs_record_who_ran_them_from_what_and_the_commit(store, tmp_path):
    rows = _rows()[:2]
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"name: runs\nworkload: mlp\ntracking: {{experiment: {EXPERIMENT}}}\n")
    spec = load_spec(sweep_file)
    sweep_dir = write_sweep(tmp_path / "runs-1", rows)
    tracker = Tracker(spec, sweep_dir)
    _finish(tracker, rows)
    parent, children = _runs(store)
    import workloads.mlp  # the built-in workload's folder

    folder = Path(workloads.mlp.__file__).parent
    head = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    for run in (parent, *children):
        tags = run.data.tags
        assert run.info.user_id == tags["mlflow.user"] == login_user() != "unknown"
        assert tags["mlflow.source.name"] == str(sweep_file.resolve())
        assert tags["mlflow.source.type"] == "LOCAL"
        if head.returncode == 0:
            assert tags["mlflow.source.git.commit"] == head.stdout.strip()
        else:
            assert "mlflow.source.git.commit" not in tags
    note = MlflowClient().get_experiment_by_name(EXPERIMENT).tags[NOTE_TAG]
    assert str(sweep_file.resolve()) in note and CONFIG_TAG in note


def test_no_commit_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert git_commit(tmp_path) is None  # tmp is no checkout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert git_commit(tmp_path) is None  # a checkout without a commit
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert git_commit(Path.cwd()) is None  # no git at all


def test_the_parent_run_describes_the_recommendation_and_headline_figures(store, tmp_path):
    rows = _rows()
    tracker, sweep_dir = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    parent, _ = _runs(store)
    note = parent.data.tags[NOTE_TAG]
    report = build_report(sweep_dir)
    assert report.recommendation.headline() in note.replace("\\", "")
    best = report.recommendation.picks[0]
    assert best.config.label in note and f"{best.value.median:,.0f}" in note
    four = [c for c in report.curves if c.points[-1].devices == 4]
    assert four and all(f"{c.points[-1].speedup.median:.2f}x at 4 devices" in note for c in four), (
        note
    )
    assert "report.html" in note

    # tracking.json holds its digest: a sync that changes nothing writes it again never
    held = json.loads((sweep_dir / "tracking.json").read_text())["stores"][0]["note"]
    assert held and len(held) == 16


def test_history_points_are_stamped_when_their_step_ended(store, tmp_path):
    rows = _rows()[:1]
    tracker, _ = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    _, (child,) = _runs(store)
    points = MlflowClient().get_metric_history(child.info.run_id, "train/loss")
    stamps = {p.step: p.timestamp for p in points}
    # trial start + setup 2 s + elapsed (0.5, 0.65, 0.8 s)
    assert stamps == {1: STARTED_MS + 2500, 2: STARTED_MS + 2650, 3: STARTED_MS + 2800}
    # the row's own figures at the trial's start, the same each time the row is logged
    (devices,) = MlflowClient().get_metric_history(child.info.run_id, "devices")
    assert (devices.step, devices.timestamp) == (0, STARTED_MS)


def test_a_continued_rows_points_end_when_its_own_window_closed(store, tmp_path):
    """search.continue_rungs: the row's history began in an earlier rung and its setup_s is
    that item's; its last step ended when this item's window closed."""
    rows = _rows()[:1]
    opened = STARTED_MS / 1000 + 10.0  # this item's window, 10 s after its start stamp
    rows[0].update(continued_from="t/0/0", window_opened_unix=opened, item_measured_s=0.3)
    tracker, _ = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    _, (child,) = _runs(store)
    points = MlflowClient().get_metric_history(child.info.run_id, "train/loss")
    end = STARTED_MS + 10_300  # opened + 0.3 s: the last step, elapsed 0.8 s
    assert {p.step: p.timestamp for p in points} == {1: end - 300, 2: end - 150, 3: end}


def test_a_history_without_elapsed_times_stamps_the_trial_start(store, tmp_path):
    rows = _rows()[:1]
    history = json.loads(rows[0]["history"])
    del history["elapsed_s"]
    rows[0]["history"] = json.dumps(history)
    tracker, _ = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    _, (child,) = _runs(store)
    points = MlflowClient().get_metric_history(child.info.run_id, "train/loss")
    assert {p.timestamp for p in points} == {STARTED_MS}


@pytest.mark.parametrize(
    "uri, url, command",
    [
        (
            "sqlite:////data/mlflow.db",
            "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning",
            "mlflow ui --backend-store-uri sqlite:////data/mlflow.db",
        ),
        (
            "sqlite:////my data/mlflow.db",
            "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning",
            "mlflow ui --backend-store-uri 'sqlite:////my data/mlflow.db'",
        ),
        (
            "https://mlflow.example.com/prefix",
            "https://mlflow.example.com/prefix/#/experiments/7/runs?workflowType=machine_learning",
            None,
        ),
        (
            "http://127.0.0.1:5001",
            "http://127.0.0.1:5001/#/experiments/7/runs?workflowType=machine_learning",
            None,
        ),
    ],
)
def test_the_link_opens_the_runs_table(uri, url, command):
    link = tracking_link(uri, "7")
    assert (link.url, link.command) == (url, command)
    assert link.lines()[-1].endswith(url)


def test_no_link_without_an_experiment_or_a_ui_to_name():
    assert tracking_link("sqlite:////data/mlflow.db", None) is None
    assert tracking_link("databricks", "7") is None
    assert tracking_link("postgresql://db/mlflow", "7") is None


def test_the_tracker_gives_the_link_when_its_parent_run_exists(store, tmp_path):
    rows = _rows()[:1]
    tracker, _ = _sweep(tmp_path, rows)
    heard = []
    tracker.on_open = heard.append
    assert tracker.link is None  # no experiment yet
    tracker.open_soon()
    tracker._writer.shutdown(wait=True)
    experiment = MlflowClient().get_experiment_by_name(EXPERIMENT).experiment_id
    assert heard == [tracker.link] and heard[0].url.endswith(
        f"/#/experiments/{experiment}/runs?workflowType=machine_learning"
    )
    assert heard[0].command == f"mlflow ui --backend-store-uri {store}"
    _finish(tracker, rows)


def test_utilisation_samples_are_each_ranks_system_metrics(store, tmp_path):
    rows = _rows()[:1]
    rows[0]["warmup_s"] = 1.0
    rows[0]["utilisation"] = json.dumps(
        [
            {"t": [0.25, 0.5], "cpu_percent": [40.0, 60.0]},
            {"t": [0.25], "cpu_percent": [90.0], "gpu_percent": [None], "gpu_mib": [512.0]},
        ]
    )
    tracker, _ = _sweep(tmp_path, rows)
    _finish(tracker, rows)
    _, (child,) = _runs(store)
    client = MlflowClient()
    history = lambda key: [  # noqa: E731
        (p.step, p.value, p.timestamp) for p in client.get_metric_history(child.info.run_id, key)
    ]
    opened = STARTED_MS + 3000  # trial start + setup 2 s + warmup 1 s: the window opens
    assert history("system/rank0/cpu_utilization_percentage") == [
        (0, 40.0, opened + 250),
        (1, 60.0, opened + 500),
    ]
    assert history("system/rank1/cpu_utilization_percentage") == [(0, 90.0, opened + 250)]
    assert history("system/rank1/gpu_memory_allocated_megabytes") == [(0, 512.0, opened + 250)]
    assert history("system/rank1/gpu_utilization_percentage") == []  # NVML gave none
    assert "system/rank0/gpu_utilization_percentage" not in child.data.metrics
