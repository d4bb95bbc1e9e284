"""A halving search run by the driver: its rungs, one after another, over ever fewer trials.

The rules (which trials survive a rung, how many steps each rung runs, which configurations the
step-time model skips) are search.halving's, pure; this module measures what they ask for,
through driver.measurement's `Measurement`: the first rung over every configuration (after
measuring a few anchors and, with `search.calibration: auto`, the all-reduce calibration the
model's skips need), then each rung over the survivors of the one before. Where the search
stands is read from results.parquet every time, so a resumed search goes on from the rung it
was in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from amdahl.driver.measurement import Measurement, rung_spec
from amdahl.driver.trainable import launch_config
from amdahl.protocol.identity import row_identity
from amdahl.search.halving import SKIPPED, SearchState, anchor_trials, predicted_skips, replay
from amdahl.search.spec_checks import AUTO_CALIBRATION, read_calibration
from amdahl.sweepdir.layout import SweepDir
from amdahl.sweepdir.table import read_results


def run_halving(measurement: Measurement) -> SearchState | None:
    """search: halving (search.halving): the first rung over every configuration (the step-time
    model's skips recorded as rows), then each rung over the survivors of the one before.
    Where it stands comes from results.parquet every time, so a resumed search goes on from
    the rung it was in. Returns where it ended (None when interrupted)."""
    spec = measurement.spec
    rows = read_results(measurement.sweep_dir).to_pylist()
    candidates = {t.trial_id for t in measurement.plan.runnable}
    if not replay(rows, spec.search, spec.train).rungs:
        skipped = {r["trial_id"] for r in rows if r.get("status") == SKIPPED}
        first = _rung0_identities(measurement, candidates - skipped)
        anchors = set(anchor_trials(list(first.values())))
        if not skipped and spec.search.skip_below is not None and anchors != set(first):
            measurement.measure(anchors, _measured_at(rows, 0), rung=0)
            if measurement.interrupt.is_set():
                return None
            if spec.search.calibration == AUTO_CALIBRATION:
                measurement.calibrate()  # in the live group; a resumed search reuses it
            rows = read_results(measurement.sweep_dir).to_pylist()
            measured = [r for r in rows if r.get("rung") == 0 and r["trial_id"] in anchors]
            rest = [first[t] for t in first if t not in anchors]
            calibration = read_calibration(spec, SweepDir(measurement.sweep_dir).calibration)
            reasons = predicted_skips(
                measured, rest, spec.search, spec.options.model_dump(), calibration
            )
            for tid, reason in reasons.items():
                measurement.record({**first[tid], "status": SKIPPED, "error": reason})
            skipped = set(reasons)
        rows = read_results(measurement.sweep_dir).to_pylist()
        measurement.measure(candidates - skipped, _measured_at(rows, 0), rung=0)
    while not measurement.interrupt.is_set():
        rows = read_results(measurement.sweep_dir).to_pylist()
        state = replay(rows, spec.search, spec.train)
        if state.finished or not state.rungs:
            return state  # where the search ended, for the closing summary
        nxt = state.rungs[-1].index + 1
        measurement.measure(set(state.rungs[-1].kept), _measured_at(rows, nxt), rung=nxt)
    return None


def _measured_at(rows: list[dict[str, Any]], rung: int) -> set[tuple[str, int]]:
    """(trial_id, repeat) pairs with a row in `rung`: a resumed rung skips them."""
    return {(r["trial_id"], r["repeat"]) for r in rows if r.get("rung") == rung}


def _rung0_identities(measurement: Measurement, trial_ids: set[str]) -> dict[str, dict[str, Any]]:
    """Row-shaped identity columns of the first rung's trials (what a skipped row records)."""
    spec = rung_spec(measurement.spec, 0)
    plan = measurement.plan
    out = {}
    for launch in plan.launches({t.trial_id for t in plan.trials} - trial_ids):
        config = replace(launch_config(spec, launch, measurement.sweep_dir, "plan"), rung=0)
        for trial in config.trials:
            out[trial.trial_id] = {**row_identity(config, trial, 0), "wall_s": 0.0}
    return out
