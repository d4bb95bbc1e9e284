"""Where each second of a step lands: the attribution rules on a fake device timeline, and on
CPU with workloads whose forward or whose input is known to be slow."""

import time

import pytest
import torch
from trial_runner import PARAMS, SlowData, SlowForward, run

from amdahl.worker.feed import DeviceFeed
from amdahl.worker.stepclock import HostClock, StepMarks, attribute
from workloads.mlp import MLP


class FakeClock:
    """A device timeline written by the test: a mark is the time the device reached it."""

    on_device = True

    def span(self, a: float, b: float) -> float:
        return b - a

    def synchronize(self) -> None:
        return None


def _step(start, forward, backward, end, host_wait=0.0, copies=(), held=()):
    return StepMarks(host_wait, [start, forward, backward, end], list(copies), list(held))


def test_device_gap_between_steps_is_the_data_wait_and_hidden_host_waits_are_not():
    # Step 0 ends at 10; the device idles until 13 for its input, then runs step 1. The host
    # waited 5 s for step 1's batch, but 2 s of that was hidden behind step 0's compute.
    steps = [
        _step(0.0, 4.0, 9.0, 10.0, host_wait=0.5),
        _step(13.0, 15.0, 19.0, 20.0, host_wait=5.0),
        _step(20.0, 22.0, 26.0, 27.0, host_wait=3.0),  # GPU-bound: the host wait is hidden
    ]
    phases = attribute(steps, FakeClock())
    assert [p["data_wait"] for p in phases] == [0.5, 3.0, 0.0]
    assert [p["host_wait"] for p in phases] == [0.5, 5.0, 3.0]
    assert phases[1] == pytest.approx(
        {
            "forward": 2.0,
            "backward": 4.0,
            "optimizer": 1.0,
            "total": 7.0,
            "data_wait": 3.0,
            "host_wait": 5.0,
            "transfer": 0.0,
        }
    )


def test_overlapped_copies_are_transfer_not_step_time():
    # Step 1's batch was copied on the side stream from 6 to 9, during step 0's backward.
    steps = [
        _step(0.0, 4.0, 9.0, 10.0, copies=[(0.0, 0.5)]),
        _step(10.0, 12.0, 16.0, 17.0, copies=[(6.0, 9.0)]),
    ]
    phases = attribute(steps, FakeClock())
    assert [p["transfer"] for p in phases] == [0.5, 3.0]
    assert phases[1]["total"] == 7.0 and phases[1]["data_wait"] == 0.0


def test_a_late_copy_shows_as_data_wait():
    # The copy for step 1 ends at 12, after step 0 ended at 10: the device waited for it.
    steps = [_step(0.0, 4.0, 9.0, 10.0), _step(12.0, 13.0, 15.0, 16.0, copies=[(8.0, 12.0)])]
    assert attribute(steps, FakeClock())[1]["data_wait"] == 2.0


def test_a_span_the_harness_held_the_device_is_cut_out_of_the_gap():
    # Step 0 ends at 3; the host finished the next step's input work and paused at 3.5 (0.5 s
    # of data wait), validated until 49, and started step 1 at 50 (1 s more of data wait).
    steps = [_step(0.0, 1.0, 2.0, 3.0), _step(50.0, 51.0, 52.0, 53.0, 0.25, held=[(3.5, 49.0)])]
    assert attribute(steps, FakeClock())[1]["data_wait"] == 1.5
    # Two holds before one step (a validation pass, then the window's opening synchronize).
    held = [(3.0, 40.0), (41.0, 59.0)]
    twice = [_step(0.0, 1.0, 2.0, 3.0), _step(60.0, 61.0, 62.0, 63.0, held=held)]
    assert attribute(twice, FakeClock())[1]["data_wait"] == 2.0


def test_the_first_step_has_no_gap_and_its_host_wait_stands_in():
    phases = attribute([_step(7.0, 8.0, 9.0, 10.0, host_wait=0.75)], FakeClock())
    assert phases[0]["data_wait"] == 0.75


def test_micro_steps_add_up_per_phase():
    marks = [0.0, 1.0, 3.0, 4.0, 6.0, 7.0]  # two (forward, backward) pairs, then the optimizer
    phases = attribute([StepMarks(0.0, marks)], FakeClock())
    assert phases[0]["forward"] == 2.0 and phases[0]["backward"] == 4.0
    assert phases[0]["optimizer"] == 1.0 and phases[0]["total"] == 7.0


def test_cpu_feed_passes_batches_through_without_copies():
    batches = iter([{"x": torch.ones(2)}, {"x": torch.zeros(2)}, {"x": torch.ones(1)}])
    feed = DeviceFeed(batches, torch.device("cpu"))
    taken = feed.take(2)
    assert [b["x"].tolist() for b in taken.batches] == [[1.0, 1.0], [0.0, 0.0]]
    assert taken.copies == []


def test_the_host_clock_counts_wall_time_a_sleeping_input_included():
    """Data wait on CPU is often a sleep (a worker waiting on I/O): a clock of CPU time
    (process_time) would read it as 0. The span between two marks lies inside a monotonic
    bracket taken around them and covers the sleep between them."""
    clock = HostClock()
    outer_start = time.monotonic()
    a = clock.mark()
    time.sleep(0.05)
    b = clock.mark()
    outer = time.monotonic() - outer_start
    clock.synchronize()
    assert 0.05 <= clock.span(a, b) <= outer + 1e-3


def test_a_slow_forward_lands_in_forward_not_in_data_wait():
    stats, error, _ = run(SlowForward(**_params()), torch.device("cpu"))
    assert error is None
    assert stats["forward_s"] >= SlowForward.FORWARD_S  # a sleep lasts at least that long
    assert stats["data_wait_s"] < stats["forward_s"] / 2
    assert stats["transfer_s"] is None  # no copies on CPU


def test_slow_input_lands_in_data_wait_not_in_the_step():
    stats, error, _ = run(SlowData(**_params()), torch.device("cpu"))
    assert error is None
    assert stats["data_wait_s"] >= SlowData.DATA_S
    assert stats["data_wait_host_s"] >= SlowData.DATA_S
    assert stats["step_time_s"] < stats["data_wait_s"] / 2
    baseline, _, _ = run(MLP(**_params()), torch.device("cpu"))
    assert baseline["data_wait_s"] < stats["data_wait_s"] / 4


def _params():
    return PARAMS
