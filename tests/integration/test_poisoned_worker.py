"""A trial whose error leaves the process unusable (a sticky CUDA error, an aborted NCCL
communicator) ends its worker: it is recorded failed with the reason, and the launch's other
trials run in a fresh worker group instead of on a poisoned CUDA context."""

import pytest

from amdahl import read_results, run_sweep, validate_spec

pytestmark = pytest.mark.integration


def test_a_poisoned_worker_costs_one_trial_and_the_rest_run_in_a_new_group(ray_cluster, tmp_path):
    spec = validate_spec(
        {
            "name": "poisoned",
            "workload": "flaky_workload:PoisonsOnce",
            "params": {
                "hidden": [32],
                "train_rows": 2048,
                "val_rows": 256,
                "poison_marker": str(tmp_path / "poisoned-once"),
            },
            "train": {"steps": 20, "warmup_steps": 2},
            "grid": {"devices": [1], "batch_size": [32, 64, 128], "sync": ["none"]},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path, tracking=False)
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert len(rows) == 3
    failed = [r for r in rows if r["status"] != "ok"]
    assert len(failed) == 1
    assert failed[0]["status"] == "failed"
    assert "ProcessPoisoned" in failed[0]["error"]
    assert "illegal memory access" in failed[0]["error"]
    ok_launches = {r["launch_id"] for r in rows if r["status"] == "ok"}
    assert len(ok_launches) == 1
