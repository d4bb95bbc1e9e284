"""A row's profiler traces (its `trace_dir` in the sweep directory) become its MLflow child run's
artifacts, byte for byte, in a real SQLite store; a row without traces attaches none."""

from __future__ import annotations

import gzip

from mlflow.tracking import MlflowClient
from report_rows import row

from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import SweepDir
from amdahl.track.tracker import Tracker


def test_traces_are_the_child_runs_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) lands here
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    files = SweepDir(sweep)
    folder = files.trace_dir("d2b128ddp", 0, None)
    folder.mkdir(parents=True)
    blobs = {r: gzip.compress(f'{{"traceEvents": [], "rank": {r}}}'.encode()) for r in (0, 1)}
    for r, blob in blobs.items():
        (folder / files.trace_file(r)).write_bytes(blob)
    traced = row(devices=2, trace_dir=folder.relative_to(sweep).as_posix(), comm_overlap=0.5)
    plain = row(devices=1, sync="none")
    spec = validate_spec({"name": "tr", "workload": "mlp", "tracking": {"experiment": "tr"}})
    tracker = Tracker(spec, sweep)
    assert tracker.log_trial(traced) and tracker.log_trial(plain), tracker.error

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("tr").experiment_id])
    children = {r.data.tags["amdahl.row"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    run = children["d2b128ddp:0"].info.run_id
    names = sorted(a.path for a in client.list_artifacts(run))
    assert names == [files.trace_file(0), files.trace_file(1)]
    for r, blob in blobs.items():
        local = client.download_artifacts(run, files.trace_file(r), str(tmp_path / f"dl{r}"))
        assert open(local, "rb").read() == blob
    assert children["d2b128ddp:0"].data.metrics["comm_overlap"] == 0.5
    assert client.list_artifacts(children["d1b128none:0"].info.run_id) == []
