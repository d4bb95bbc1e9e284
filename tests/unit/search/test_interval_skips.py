"""Halving's model skips read the prediction's 80% interval: a configuration is skipped only when
even the interval's high end is below `skip_below` of the best measured objective."""

from __future__ import annotations

from amdahl.analysis.intervals import Evidence, interval
from amdahl.search.halving import predicted_skips
from amdahl.spec.schema import SearchSpec


def _candidate(tid: str, devices: int, batch: int) -> dict:
    return {
        "trial_id": tid,
        "workload": "mlp",
        "params": "{}",
        "scaling": "weak",
        "devices": devices,
        "batch_size": batch,
        "precision": "fp32",
        "compile": "eager",
        "data_workers": 1,
        "input": "ray_data",
        "prefetch_batches": 2,
        "sync": "none",
        "steps": 10,
        "warmup_steps": 2,
    }


def _measured(tid: str, batch: int, step_s: float) -> dict:
    return {
        **_candidate(tid, 1, batch),
        "repeat": 0,
        "status": "ok",
        "throughput": batch / step_s,
        "step_time_s": step_s,
        "data_wait_s": 0.0,
        "micro_steps": 1,
        "global_batch": batch,
    }


# Compute 1 ms + 0.1 ms per sample: batch 8 runs 1.8 ms, batch 512 52.2 ms (9.8k/s, the best);
# batch 2 on 2 devices: 1.2 ms for 4 samples, 3,333/s predicted.
ROWS = [_measured("small", 8, 0.0018), _measured("big", 512, 0.0522)]
BEST = 512 / 0.0522
POINT = 4 / 0.0012


def test_a_point_below_the_line_whose_interval_reaches_above_it_is_measured():
    # Measured at 1 device only: no self-check, the interval is the held-out error's.
    band = interval(POINT, 2, Evidence(1))
    assert band.high > POINT * 1.05
    between = (POINT + band.high) / 2 / BEST  # the point below this share, the high end above
    slow = _candidate("d2-tiny", 2, 2)
    assert (
        predicted_skips(ROWS, [slow], SearchSpec(method="halving", skip_below=between), {}, None)
        == {}
    )
    below = band.high * 1.01 / BEST  # the whole interval below
    skips = predicted_skips(ROWS, [slow], SearchSpec(method="halving", skip_below=below), {}, None)
    assert set(skips) == {"d2-tiny"}
    assert "80% interval up to" in skips["d2-tiny"] and "high end" in skips["d2-tiny"]
