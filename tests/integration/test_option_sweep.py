"""An option swept as a list, end to end on a local Ray (issue 48): `grid.options` crossed with
sync, every trial run with its option (fsdp's through `fully_shard`), the rows, MLflow, the
report's labels and best.yaml carrying each swept value."""

import json

import pytest

from amdahl import load_spec, run_sweep, validate_spec
from amdahl.sweepdir.table import read_results

pytestmark = pytest.mark.integration

SPEC = {
    "name": "optioned",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 1024, "val_rows": 128},
    "train": {"steps": 6, "warmup_steps": 1, "profile_steps": 0},
    "grid": {
        "devices": [2],
        "batch_size": [32],
        "sync": ["ddp", "fsdp"],
        "options": {
            "bucket_cap_mb": [1, 25],
            "fsdp_reshard_after_forward": [True, False],
            "fsdp_param_dtype": [None, "bf16"],
        },
    },
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
}


def test_every_swept_option_value_runs_and_is_carried_to_the_report(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    try:
        outcome = run_sweep(validate_spec(SPEC), runs_dir=tmp_path / "runs")
    finally:
        mp.undo()
    # ddp x 2 buckets, fsdp x 2 x 2: the fsdp options make no ddp duplicate, nor buckets fsdp
    assert len(outcome.plan.trials) == 6
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows
    options = sorted(json.dumps(json.loads(r["options"] or "{}"), sort_keys=True) for r in rows)
    assert options == sorted(
        [
            '{"bucket_cap_mb": 1.0}',
            "{}",
            "{}",
            '{"fsdp_reshard_after_forward": false}',
            '{"fsdp_param_dtype": "bf16"}',
            '{"fsdp_param_dtype": "bf16", "fsdp_reshard_after_forward": false}',
        ]
    )
    labels = set(outcome.plan.labels.values())
    assert len(labels) == 6
    assert "d2 b32 fp32 eager w1 ddp bucket1" in labels
    assert "d2 b32 fp32 eager w1 fsdp reshard-false param-bf16" in labels
    report = (outcome.sweep_dir / "report.md").read_text()
    assert all(label in report for label in labels)
    best = load_spec(outcome.sweep_dir / "best.yaml")
    assert best.grid.option_axes() == {}
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [MlflowClient(tracking_uri=uri).get_experiment_by_name("optioned").experiment_id]
    )
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(children) == 6
    by_id = {r["trial_id"]: r for r in rows}
    for child in children:
        row = by_id[child.data.params["trial_id"]]
        if row["sync"] == "ddp":
            assert child.data.params["options.bucket_cap_mb"] in ("1.0", "25.0")
        else:
            assert child.data.params["options.fsdp_param_dtype"] in ("None", "bf16")
