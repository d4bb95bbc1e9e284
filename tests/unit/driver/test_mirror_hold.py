"""The driver's MLflow writes stay out of short measured windows (driver/measurement.py,
`MIRROR_AT_ONCE_FROM_S`): a row whose window was short reaches the store only once the sweep
stops measuring (`mirror_held`); a long one as it arrives. Results.parquet has both at once."""

from __future__ import annotations

from mlflow.tracking import MlflowClient
from report_rows import row

from amdahl.driver.measurement import MIRROR_AT_ONCE_FROM_S, Measurement
from amdahl.driver.signals import InterruptFlag
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.table import read_results
from amdahl.track.tracker import Tracker

SPEC = validate_spec({"name": "hold", "workload": "mlp", "tracking": {"experiment": "hold"}})


def _children(uri: str) -> list[str]:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("hold")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    return sorted(r.data.tags["amdahl.row"] for r in runs if "mlflow.parentRunId" in r.data.tags)


def _drain(tracker: Tracker) -> None:
    """Wait for what the tracker's thread was given (its one thread runs writes in order)."""
    if tracker._writer is not None:
        tracker._writer.submit(lambda: None).result()


def test_short_windows_reach_mlflow_once_measuring_is_over(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    sweep_dir = tmp_path / "hold-1"
    sweep_dir.mkdir()
    tracker = Tracker(SPEC, sweep_dir)
    seen: list = []
    measurement = Measurement(
        SPEC, None, sweep_dir, [], tracker, seen.append, InterruptFlag(), True, True
    )
    short = row(devices=1, batch=32, item_measured_s=0.4, measured_s=0.4)
    # a continued row pools windows (measured_s), but its own window is item_measured_s
    pooled = row(devices=2, batch=32, item_measured_s=0.4, measured_s=MIRROR_AT_ONCE_FROM_S * 3)
    long = row(devices=1, batch=64, measured_s=MIRROR_AT_ONCE_FROM_S + 1)
    for r in (short, pooled, long):
        measurement.record(r)
    _drain(tracker)
    assert len(read_results(sweep_dir)) == 3 and len(seen) == 3  # the table and the live view
    assert _children(uri) == [f"{long['trial_id']}:0"]  # the long window's only
    assert [r["trial_id"] for r in measurement.held_from_mlflow] == ["d1b32ddp", "d2b32ddp"]

    measurement.mirror_held()
    _drain(tracker)
    assert _children(uri) == sorted(f"{r['trial_id']}:0" for r in (short, pooled, long))
    assert measurement.held_from_mlflow == []
    tracker.close()
