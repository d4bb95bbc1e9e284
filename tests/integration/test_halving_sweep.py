"""search: halving end to end on local Ray: rungs of growing length over fewer configurations,
a last rung measuring each finalist twice (interleaved), a configuration the step-time model
predicts far behind recorded as skipped, the report's Search section, and a resume that goes on
from the rung (and the repeat) results.parquet says it was in."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from amdahl import read_results, run_sweep, validate_spec
from amdahl.search.halving import SKIPPED, replay
from amdahl.sweepdir.layout import SweepDir

pytestmark = pytest.mark.integration

HALVING = {
    "name": "halving",
    "workload": "mlp",
    "params": {"hidden": [32], "train_rows": 4096, "val_rows": 256},
    "train": {"steps": 12, "warmup_steps": 2},
    # A 4-sample batch is all per-step overhead beside 1024 (over 10x the samples/s on one
    # device): the model, fitted on the 1-device rows, puts 2 devices at batch 4 far behind.
    "grid": {"devices": [1, 2], "batch_size": [4, 1024], "sync": ["ddp", "none"]},
    "search": {
        "method": "halving",
        "min_steps": 3,
        "eta": 2,
        "skip_below": 0.9,
        "final_repeats": 2,
    },
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


@pytest.fixture(scope="module")
def searched(ray_cluster, tmp_path_factory):
    spec = validate_spec(HALVING)
    outcome = run_sweep(spec, runs_dir=tmp_path_factory.mktemp("halving") / "runs")
    return spec, outcome


def _by_rung(rows):
    out = {}
    for r in rows:
        if r["status"] != SKIPPED:
            out.setdefault(r["rung"], set()).add(r["trial_id"])
    return out


def test_rungs_grow_longer_over_the_survivors_of_the_rung_before(searched):
    spec, outcome = searched
    rows = read_results(outcome.sweep_dir).to_pylist()
    assert all(r["status"] in ("ok", SKIPPED) for r in rows), [r["error"] for r in rows]
    by_rung = _by_rung(rows)
    assert sorted(by_rung) == [0, 1, 2]
    assert {r["steps"] for r in rows if r["rung"] == 2 and r["status"] == "ok"} == {12}
    state = replay(rows, spec.search, spec.train)
    assert state.finished
    # The last rung measures each finalist twice: every first run, then every second one.
    final = [r for r in rows if r["rung"] == 2]
    assert [r["repeat"] for r in final] == [0] * len(by_rung[2]) + [1] * len(by_rung[2])
    assert [r["trial_id"] for r in final[: len(by_rung[2])]] == [
        r["trial_id"] for r in final[len(by_rung[2]) :]
    ]
    assert all(r["repeat"] == 0 for r in rows if r["rung"] != 2)
    assert state.rungs[-1].measured == outcome.search.rungs[-1].measured  # what the CLI prints
    assert all(len(state.rungs[-1].repeats[t]) == 2 for t in state.rungs[-1].measured)
    for g in state.rungs[:-1]:
        assert by_rung[g.index + 1] == set(g.kept)  # exactly the survivors ran next
        assert len(g.kept) < len(by_rung[g.index]) or not g.dropped
    for g in state.rungs:
        for why in g.dropped.values():
            assert why.startswith(f"rung {g.index}")
    # A promoted configuration continues its trial from the rung before (kept in its ranks;
    # the 2-device ones across the 1-device trials between, in their own process group): the
    # row pools the windows and keeps the first item's set-up and warmup; the last rung's
    # second repeats, which no earlier rung ran, start fresh.
    first = {r["trial_id"]: r for r in rows if r["rung"] == 0 and r["status"] == "ok"}
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["rung"] == 0 or r["repeat"] == 1:
            assert (r["windows"], r["continued_from"]) == (1, None), r
            continue
        assert r["continued_from"] == f"{r['trial_id']}/0/{r['rung'] - 1}", r["restart_reason"]
        assert r["windows"] == r["rung"] + 1 and r["restart_reason"] is None
        assert r["warmup_s"] == first[r["trial_id"]]["warmup_s"]
        assert r["setup_s"] == first[r["trial_id"]]["setup_s"]
    assert any(r["devices"] == 2 and r["continued_from"] for r in rows)
    # rungs before the last only rank: no validation pass, no exposed-communication
    # calibration; the last rung measures everything
    for r in rows:
        if r["status"] == "ok":
            last = r["rung"] == 2
            assert (r["val_loss"] is not None) == last, r
            if r["devices"] == 2 and r["sync"] == "ddp":
                assert (r["comm_s"] is not None) == last, r


def test_a_configuration_predicted_far_behind_is_a_skipped_row_with_the_prediction(searched):
    _, outcome = searched
    rows = read_results(outcome.sweep_dir).to_pylist()
    skipped = [r for r in rows if r["status"] == SKIPPED]
    skipped_configs = [(r["devices"], r["batch_size"], r["sync"]) for r in skipped]
    # Batch 4 on 2 devices is far behind by construction; whether batch 1024 on 2 devices also
    # falls under skip_below depends on the 1-device timings (a loaded CI box once put it there),
    # so only the certain skip is asserted, and that nothing measured on 1 device is skipped.
    assert (2, 4, "none") in skipped_configs
    assert all(devices == 2 for devices, _, _ in skipped_configs), skipped_configs
    for r in skipped:
        assert "predicted" in r["error"] and "step-time model" in r["error"]
    # ddp at 2 devices has no communication model (no calibration): measured, never skipped.
    assert any(r["devices"] == 2 and r["sync"] == "ddp" for r in rows if r["rung"] == 0)
    report = SweepDir(outcome.sweep_dir).report_md.read_text()
    assert "Search: successive halving" in report and "Skipped by prediction" in report
    assert "| against the best |" in report and "| best |" in report


def test_a_resume_goes_on_from_the_rung_results_parquet_says(searched):
    spec, outcome = searched
    path = SweepDir(outcome.sweep_dir).results
    table = pq.read_table(path)
    before = _by_rung(table.to_pylist())
    # As if the driver died in the last rung, after its first run: the rest is not there.
    rungs = table["rung"].to_pylist()
    first_final = rungs.index(2)
    keep = pa.array([rung != 2 or i == first_final for i, rung in enumerate(rungs)])
    pq.write_table(table.filter(keep), path)
    again = run_sweep(spec, runs_dir=outcome.sweep_dir.parent, resume=outcome.sweep_dir)
    # Rungs 0 and 1 were not measured again, nor the last rung's run that was there.
    assert {r["rung"] for r in again.rows} == {2}
    assert len(again.rows) == rungs.count(2) - 1
    # the new worker group holds no kept trial: the rung's first repeats start fresh, saying why
    for r in again.rows:
        assert r["continued_from"] is None and r["windows"] == 1
        if r["repeat"] == 0:
            assert "not kept in this worker group" in r["restart_reason"], r
    assert _by_rung(read_results(outcome.sweep_dir).to_pylist()) == before


def test_calibration_auto_measures_the_collective_once_and_the_model_then_skips_ddp(
    ray_cluster, tmp_path
):
    spec = validate_spec(
        {
            **HALVING,
            "grid": {"devices": [1, 2], "batch_size": [4, 1024], "sync": ["ddp"]},
            "search": {**HALVING["search"], "calibration": "auto"},
        }
    )
    outcome = run_sweep(spec, runs_dir=tmp_path / "runs")
    calibration = SweepDir(outcome.sweep_dir).calibration
    assert calibration.exists()  # measured in the sweep's Ray, where the report reads it too
    rows = read_results(outcome.sweep_dir).to_pylist()
    skipped = [(r["devices"], r["batch_size"]) for r in rows if r["status"] == SKIPPED]
    # without a calibration ddp on 2 devices cannot be predicted and is always measured
    assert skipped == [(2, 4)], [(r["devices"], r["batch_size"], r["error"]) for r in rows]
    measured_at = calibration.stat().st_mtime_ns
    run_sweep(spec, runs_dir=outcome.sweep_dir.parent, resume=outcome.sweep_dir)
    assert calibration.stat().st_mtime_ns == measured_at  # a resume reuses it
