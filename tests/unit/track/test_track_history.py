"""What MLflow's charts draw from a sweep: per-step curves on each child run (the results'
`history` column, step = the optimizer step), scaling curves on the parent run (step = the
device count, figures from the report's own functions) and the best configuration's figures;
the experiment tagged as model training unless it has a kind. All written by the driver in a
few batches within MLflow's limits, and not again when nothing changed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient
from report_rows import row, scaling_rows, write_sweep

from amdahl.columns import HISTORY_POINTS, history_steps
from amdahl.report import report_from_rows
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import TRACKING_FILE
from amdahl.track.child_run import HISTORY_METRICS
from amdahl.track.mlflow_store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, log_batches
from amdahl.track.parent_run import metric_names, scaling_metrics
from amdahl.track.tracker import Tracker

EXPERIMENT = "curves"


def _history(steps: int) -> str:
    kept = history_steps(steps)
    return json.dumps(
        {
            "step": [i + 1 for i in kept],
            "loss": [2.0 / (i + 1) for i in kept],
            "step_time_s": [0.01 + i * 1e-5 for i in kept],
            "data_wait_s": [0.001 for _ in kept],
        }
    )


def _rows() -> list[dict]:
    rows = scaling_rows()
    for r in rows:
        r["history"] = _history(500)
        r["started_at"] = "2026-01-02T03:04:05+00:00"
    return rows


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def _tracker(sweep_dir, experiment: str = EXPERIMENT) -> Tracker:
    sweep_dir.mkdir(exist_ok=True)
    spec = validate_spec(
        {"name": "curves", "workload": "mlp", "tracking": {"experiment": experiment}}
    )
    return Tracker(spec, sweep_dir)


def _sync(tracker: Tracker, rows: list[dict]) -> int:
    pushed = tracker.sync(rows)
    assert tracker.error is None and tracker.offline_reason is None, tracker.error
    return pushed


def _runs(uri: str, experiment: str = EXPERIMENT) -> tuple[object, list]:
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    return parents[0], [r for r in runs if "mlflow.parentRunId" in r.data.tags]


# ---- the results' history column -------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 1, 2, 50, HISTORY_POINTS, HISTORY_POINTS + 1, 1000, 12345])
def test_history_keeps_at_most_its_limit_evenly_spaced_with_first_and_last(count):
    kept = history_steps(count)
    assert len(kept) == min(count, HISTORY_POINTS)
    assert kept == sorted(set(kept))
    if count:
        assert kept[0] == 0 and kept[-1] == count - 1
    if count > HISTORY_POINTS:
        gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
        assert max(gaps) - min(gaps) <= 1  # evenly spaced, up to rounding


# ---- child runs: per-step curves --------------------------------------------------------------


def test_each_child_run_carries_its_per_step_curves_with_the_optimizer_step(tmp_path, store):
    rows = _rows()
    assert _sync(_tracker(tmp_path / "sweep"), rows) == len(rows)
    client = MlflowClient(tracking_uri=store)
    _, children = _runs(store)
    assert len(children) == len(rows)
    expected = json.loads(rows[0]["history"])
    for child in children:
        for series, key in HISTORY_METRICS.items():
            points = client.get_metric_history(child.info.run_id, key)
            assert [p.step for p in sorted(points, key=lambda p: p.step)] == expected["step"]
            by_step = {p.step: p.value for p in points}
            assert by_step[500] == pytest.approx(expected[series][-1])
        # the summary columns keep their names and values: the curves are apart from them
        assert child.data.metrics["throughput"] > 0
        assert "train/loss" in child.data.metrics


def test_a_row_logged_again_keeps_one_copy_of_each_point(tmp_path, store):
    """A trial recorded failed and then retried ok is logged again into its run; logging the
    same curve twice (a crash before the state was saved) leaves one point per step."""
    rows = _rows()[:1]
    tracker = _tracker(tmp_path / "sweep")
    _sync(tracker, [{**rows[0], "status": "diverged"}])
    _sync(tracker, rows)  # the retried row replaces it: logged into the same run
    client = MlflowClient(tracking_uri=store)
    _, children = _runs(store)
    assert len(children) == 1
    points = client.get_metric_history(children[0].info.run_id, "train/loss")
    assert len(points) == len(json.loads(rows[0]["history"])["step"])


def test_rows_without_history_log_as_before(tmp_path, store):
    rows = [row(1, 128), {**row(1, 128), "trial_id": "x", "status": "failed", "throughput": None}]
    assert _sync(_tracker(tmp_path / "sweep"), rows) == 2
    _, children = _runs(store)
    assert all(not any(k.startswith("train/") for k in c.data.metrics) for c in children)


def test_batches_stay_within_mlflows_limits():
    metrics, params, tags = list(range(2500)), list(range(150)), list(range(10))
    batches = list(log_batches(metrics, params, tags))
    for m, p, t in batches:
        assert len(m) <= 1000 and len(p) + len(t) <= 100 and len(m) + len(p) + len(t) <= 1000
    assert [x for m, _, _ in batches for x in m] == metrics
    assert [x for _, p, _ in batches for x in p] == params
    assert [x for _, _, t in batches for x in t] == tags
    assert list(log_batches([], [], [])) == [([], [], [])]


# ---- the parent run: scaling curves and the best configuration --------------------------------


def test_scaling_figures_come_from_the_report_with_step_equal_to_devices():
    rows = _rows()
    metrics, tags = scaling_metrics(rows)
    report = report_from_rows(rows)
    curve = report.curves[0]
    name = metric_names([c.label for c in report.curves])[0]
    series = {}
    for key, value, step in metrics:
        series.setdefault(key, {})[step] = value
    devices = [p.devices for p in curve.points]
    assert sorted(series[f"throughput/{name}"]) == devices
    for point in curve.points:
        assert series[f"throughput/{name}"][point.devices] == point.config.throughput.median
        assert series[f"speedup/{name}"][point.devices] == pytest.approx(point.speedup.median)
        assert series[f"efficiency/{name}"][point.devices] == pytest.approx(point.efficiency)
    assert series[f"speedup/{name}"][1] == pytest.approx(1.0)
    best = report.recommendation.picks[0].config
    assert series["best/throughput"] == {0: best.throughput.median}
    assert series["best/devices"] == {0: best.devices}
    assert tags == {"amdahl.best": best.label}
    assert scaling_metrics([]) == ([], {})


def test_metric_names_are_valid_short_and_distinct():
    from mlflow.utils.validation import _validate_metric_name

    labels = ["b128 fp32 eager w1 ddp", 'b8 hidden=[32,"x"] val_accuracy>=0.9', "a/b", "a_b", "."]
    names = metric_names(labels)
    assert names[0] == "b128 fp32 eager w1 ddp"
    assert len(set(names)) == len(names)
    for figure in ("throughput", "speedup", "efficiency"):
        for name in names:
            _validate_metric_name(f"{figure}/{name}")
    assert len(metric_names(["x" * 1000])[0]) == 200


def test_the_parent_run_draws_scaling_curves_once_per_change(tmp_path, store):
    rows = _rows()
    tracker = _tracker(tmp_path / "sweep")
    _sync(tracker, rows)
    client = MlflowClient(tracking_uri=store)
    parent, _ = _runs(store)
    keys = [k for k in parent.data.metrics if k.startswith("throughput/")]
    assert keys, parent.data.metrics
    history = client.get_metric_history(parent.info.run_id, keys[0])
    assert sorted(p.step for p in history) == sorted({r["devices"] for r in rows})
    assert parent.data.tags["amdahl.best"]
    assert {"best/throughput", "best/devices"} <= set(parent.data.metrics)
    state = json.loads((tmp_path / "sweep" / TRACKING_FILE).read_text())
    assert f"{keys[0]}@1" in state["stores"][0]["figures"]

    # Nothing changed: a second sync, or another tracker of the same directory, writes nothing.
    _sync(_tracker(tmp_path / "sweep"), rows)
    assert len(client.get_metric_history(parent.info.run_id, keys[0])) == len(history)

    # A resumed sweep's end logs the whole directory's figures, adding only its new points.
    more = [*rows, row(8, 128, throughput=3500.0)]
    write_sweep(tmp_path / "sweep", more)
    tracker = _tracker(tmp_path / "sweep")
    tracker.finish(SimpleNamespace(rows=[], wall_s=1.0, failed=[]))
    assert tracker.error is None, tracker.error
    steps = [p.step for p in client.get_metric_history(parent.info.run_id, keys[0])]
    assert sorted(steps) == [1, 2, 4, 8]
    parent, _ = _runs(store)
    assert parent.data.metrics["best/devices"] == 8


# ---- the experiment's kind ------------------------------------------------------------------


def test_the_experiment_is_tagged_as_model_training_unless_it_has_a_kind(tmp_path, store):
    client = MlflowClient(tracking_uri=store)
    rows = [row(1, 128)]
    _sync(_tracker(tmp_path / "new"), rows)  # created by amdahl
    tags = client.get_experiment_by_name(EXPERIMENT).tags
    assert tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"

    client.create_experiment("plain")  # there before, without a kind
    _sync(_tracker(tmp_path / "plain", "plain"), rows)
    assert client.get_experiment_by_name("plain").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND

    client.create_experiment("genai", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    _sync(_tracker(tmp_path / "genai", "genai"), rows)  # a kind that is set is left alone
    assert client.get_experiment_by_name("genai").tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_a_recorded_sweep_tags_an_experiment_that_predates_the_kind(tmp_path, store):
    client = MlflowClient(tracking_uri=store)
    _sync(_tracker(tmp_path / "sweep"), [row(1, 128)])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    client.delete_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG)
    _sync(_tracker(tmp_path / "sweep"), [row(1, 128), row(2, 128, throughput=1800.0)])
    assert client.get_experiment_by_name(EXPERIMENT).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
