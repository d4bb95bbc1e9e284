"""Eight ranks on a 2-core box, for real: the simulated accelerator (workloads/simulated.py)
sleeps where a GPU would compute, so DDP's buckets, gloo's all-reduces, per-trial worlds,
the profiler pass and the closing calibration run at a scale no CPU workload reaches here.

One sweep: 2-, 4- and 8-device trials served by one worker group, a straggler rank the traces
must name, and an 8-device trial whose rank 7 dies, after which the sweep goes on."""

import json

import pytest

from amdahl import run_sweep, validate_spec
from amdahl.sweepdir.table import read_results

pytestmark = pytest.mark.integration

STRAGGLER, STRAGGLER_FACTOR = 5, 4.0
LAYERS, FORWARD_FIXED_MS, BATCH = 4, 2.0, 16
#: One step's sleeps on a rank that is not the straggler: each layer's forward (fixed + 20 us a
#: sample, the default) and its backward (2x, the default).
STATED_STEP_S = LAYERS * (FORWARD_FIXED_MS + 0.020 * BATCH) / 1e3 * 3


@pytest.fixture(scope="module")
def scale_sweep(ray_cluster, tmp_path_factory):
    spec = validate_spec(
        {
            "name": "scale8",
            "workload": "flaky_workload:SimulatedRankDies",
            "params": {
                "layers": LAYERS,
                "forward_fixed_ms": FORWARD_FIXED_MS,
                "straggler_rank": STRAGGLER,
                "straggler_factor": STRAGGLER_FACTOR,
                "train_rows": 1024,
                "val_rows": 64,
            },
            "train": {"steps": 10, "warmup_steps": 2, "profile_steps": 2},
            "grid": {
                "devices": [2, 4, 8],
                "batch_size": [BATCH],
                "sync": ["ddp"],
                "params.kill_rank": [7, None],  # at 8 devices the dying trial goes first
            },
            "exclude": [
                {"devices": 2, "params.kill_rank": 7},
                {"devices": 4, "params.kill_rank": 7},
            ],
            "resources": {"cpus_per_device": 0.2, "cpus_per_data_worker": 0.2},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path_factory.mktemp("scale"), tracking=False)
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert len(rows) == 4, rows  # every trial recorded once: none lost, none twice
    return outcome, {(r["devices"], r["params"]): r for r in rows}


def _row(rows, devices, kill_rank=None):
    return next(
        r for (d, p), r in rows.items() if d == devices and json.loads(p)["kill_rank"] == kill_rank
    )


def test_one_worker_group_serves_2_4_and_8_devices(scale_sweep):
    outcome, rows = scale_sweep
    ok = [_row(rows, d) for d in (2, 4, 8)]
    assert [r["status"] for r in ok] == ["ok"] * 3, [(r["devices"], r["error"]) for r in ok]
    # no faster than the stated sleeps allow (every rank sleeps them each step), and at 8 the
    # straggler's 4x sleeps hold every rank back: measured against the workload's statement
    for r in ok:
        slowest = STRAGGLER_FACTOR if r["devices"] > STRAGGLER else 1.0
        assert 0 < r["throughput"] <= r["devices"] * BATCH / (STATED_STEP_S * slowest)
    # the dead rank's trial cost one restart: the 2- and 4-device trials ran in the first
    # group, before it; the healthy 8-device trial after it, in the group started then
    assert outcome.group_starts == 2
    assert outcome.group_start_reasons[0] == "first start of a shape"
    assert outcome.group_start_reasons[1].startswith("again"), outcome.group_start_reasons
    dead = _row(rows, 8, kill_rank=7)
    assert ok[0]["started_at"] < ok[1]["started_at"] < dead["started_at"] < ok[2]["started_at"]
    assert ok[0]["launch_entered_unix_s"] is not None  # the first group's first row
    assert ok[1]["launch_entered_unix_s"] is None  # the same group, no new start
    assert ok[2]["launch_entered_unix_s"] is not None  # the group started after the death


def test_a_dead_rank_at_8_fails_its_trial_and_the_sweep_goes_on(scale_sweep):
    _, rows = scale_sweep
    dead = _row(rows, 8, kill_rank=7)
    assert dead["status"] != "ok"
    assert dead["error"].startswith("launch failed: ")


def test_the_traces_name_the_straggler_and_measure_overlap(scale_sweep):
    _, rows = scale_sweep
    eight = _row(rows, 8)
    assert eight["straggler_rank"] == STRAGGLER
    # rank 5 sleeps 4x as long: the others wait for it, several simulated layers' worth
    assert eight["straggler_s"] > 0.02
    assert eight["comm_trace_s"] > 0  # the traces hold the all-reduces
    assert 0.0 <= eight["comm_overlap"] <= 1.0
    four = _row(rows, 4)  # no rank 5 among 4: nobody is that slow
    assert four["straggler_s"] < eight["straggler_s"]


def test_the_closing_calibration_runs_at_8(scale_sweep):
    outcome, _ = scale_sweep
    calibration = json.loads((outcome.sweep_dir / "calibration.json").read_text())
    assert calibration["devices"] == 8
    assert calibration["all_reduce"]
    # and over the first 2, 3 and 4 ranks: how the all-reduce grows with p, measured
    assert set(calibration["all_reduce_by_devices"]) == {"2", "3", "4", "8"}
    assert "8" in calibration["by_devices"] and len(calibration["by_devices"]) >= 2
