"""One worker group serves every device count on a single node (worlds.py): a trial on fewer
devices than its group runs on the first ranks with a process group of its own size, and computes
exactly what it computes in a worker group of its own."""

import json

import pytest

from amdahl import read_results, run_sweep, validate_spec

pytestmark = pytest.mark.integration

SPEC = {
    "name": "worlds",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
    "train": {"steps": 12, "warmup_steps": 2},
    # strategies that build on the default process group in different ways: DDP's reducer,
    # ZeRO's optimizer-state partition, FSDP2's device mesh
    "grid": {"devices": [2, 1], "batch_size": [32], "sync": ["ddp", "zero1", "fsdp"]},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


def _rows(tmp_path, share: bool) -> dict[str, dict]:
    outcome = run_sweep(
        validate_spec(SPEC),
        runs_dir=tmp_path / str(share),
        worker_groups="per_shape" if share else "per_device_count",
    )
    return {r["trial_id"]: r for r in read_results(outcome.sweep_dir).to_pylist()}


def test_a_trial_computes_the_same_in_a_shared_worker_group(ray_cluster, tmp_path):
    shared, alone = _rows(tmp_path, True), _rows(tmp_path, False)
    assert len(shared) == len(alone) == 6
    assert len({r["launch_id"] for r in shared.values()}) == 1
    assert len({r["launch_id"] for r in alone.values()}) == 2
    for trial_id, row in shared.items():
        assert row["status"] == "ok", row["error"]
        devices = row["devices"]
        assert row["global_batch"] == 32 * devices
        assert len(json.loads(row["nodes"])) == devices  # only the trial's own ranks took part
        # same seed, same shards, same collectives: the same numbers, bit for bit on CPU
        for metric in ("final_loss", "val_loss", "val_accuracy", "model_state_bytes"):
            assert row[metric] == alone[trial_id][metric], (devices, row["sync"], metric)
