"""An item's seconds outside its measured window land in the column of the part that spent
them (issue 31: the per-item breakdown `benchmarks/sweep_timeline.py` prints). A shifted clock
makes each part take a known, distinct time: set-up 10 s, the exposed-communication probe 30 s,
validation 20 s; each must show in its own column, none in the window, and the row's wall
seconds must hold them all."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from trial_runner import PARAMS, launch_config, loader_source, trial_config

from amdahl.worker import rows, trial
from amdahl.worker.input import validation_rows
from amdahl.worker.trial import Placement, TrialRun, run_trial
from workloads.mlp import MLP

SETUP_S, PROBE_S, VALIDATION_S = 10.0, 30.0, 20.0


class ShiftedClock(SimpleNamespace):
    """`time` as the worker modules see it, `perf_counter` ahead by `offset` seconds."""

    offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def __getattr__(self, name: str):
        return getattr(time, name)


def _taking(clock: ShiftedClock, seconds: float, call):
    def shifted(*args, **kwargs):
        result = call(*args, **kwargs)
        clock.offset += seconds
        return result

    return shifted


@pytest.fixture
def clock(monkeypatch) -> ShiftedClock:
    clock = ShiftedClock()
    for module in (trial, rows):
        monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(trial, "_start_trial", _taking(clock, SETUP_S, trial._start_trial))
    monkeypatch.setattr(
        trial, "_exposed_communication", _taking(clock, PROBE_S, trial._exposed_communication)
    )
    monkeypatch.setattr(trial, "_evaluate", _taking(clock, VALIDATION_S, trial._evaluate))
    return clock


def test_each_part_outside_the_window_is_its_own_column(clock):
    workload, config = MLP(**PARAMS), trial_config()
    launch = launch_config((config,), steps=20, warmup_steps=4)
    val = validation_rows(workload, None, seed=0)
    started = clock.perf_counter()
    stats = run_trial(
        TrialRun(
            workload,
            config,
            launch,
            loader_source(workload),
            val,
            Placement(torch.device("cpu"), 0, 1),
        )
    )
    row = rows.results_row(
        launch,
        config,
        0,
        [{"stats": stats, "error": None, "node": "n"}],
        started,
        "t",
        torch.device("cpu"),
    )
    # a 20-step tiny MLP's own seconds (under 1 s here, 2.1 s once on a loaded CI box), each
    # part's shifted seconds apart from the others' by more than it
    slack = 5.0
    assert SETUP_S <= row["setup_s"] < SETUP_S + slack
    assert PROBE_S <= row["comm_probe_s"] < PROBE_S + slack
    assert VALIDATION_S <= row["validation_s"] < VALIDATION_S + slack
    # none of them in the window or the warmup
    assert row["measured_s"] < slack and row["item_measured_s"] < slack
    assert row["warmup_s"] < slack
    # the row's wall seconds hold every part; what is left over ("other" in the timeline) is
    # the row's own gathering and the FLOP count, small
    parts = sum(row[k] for k in ("setup_s", "comm_probe_s", "validation_s", "warmup_s"))
    other = row["wall_s"] - parts - row["item_measured_s"]
    assert 0 <= other < slack
