"""The `history` column's `elapsed_s`: when each kept step ended, from the first step's input
wait, on the step clock. The MLflow mirror stamps each curve point with it, so its charts against
wall or relative time spread the points as the trial ran them. Checked on CPU against a
monotonic bracket around the whole trial and against the sleeps every forward takes."""

from __future__ import annotations

import json
import time

import torch
from trial_runner import PARAMS, SlowForward, run


def test_elapsed_grows_by_each_step_and_fits_inside_the_trial():
    outer_start = time.monotonic()
    stats, error, _ = run(SlowForward(**PARAMS), torch.device("cpu"))
    outer = time.monotonic() - outer_start
    assert error is None
    history = stats["history"]
    json.dumps(history)  # what goes into the results table
    steps, elapsed = history["step"], history["elapsed_s"]
    assert len(elapsed) == len(steps) == 10  # warmup 2 + steps 8, all kept
    gaps = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    assert all(g >= SlowForward.FORWARD_S for g in gaps), gaps  # every step sleeps that long
    # Step i ended one step time and one input wait after step i-1 (no validation between).
    for i, gap in enumerate(gaps, start=1):
        step = history["step_time_s"][i] + history["data_wait_s"][i]
        assert abs(gap - step) < 5e-3, (i, gap, step)
    # The first point is the first step's wait and step; the last lies inside the trial.
    assert abs(elapsed[0] - history["step_time_s"][0] - history["data_wait_s"][0]) < 5e-3
    assert len(steps) * SlowForward.FORWARD_S <= elapsed[-1] < outer
