"""Where each second of a step lands: the attribution rules on a fake device timeline, and on
CPU with workloads whose forward or whose input is known to be slow."""

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


def _step(start, forward, backward, end, host_wait=0.0, copies=(), gap_is_input=True):
    return StepMarks(host_wait, [start, forward, backward, end], list(copies), gap_is_input)


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


def test_after_a_validation_pass_the_host_wait_stands_in_for_the_gap():
    steps = [_step(0.0, 1.0, 2.0, 3.0), _step(50.0, 51.0, 52.0, 53.0, 0.25, gap_is_input=False)]
    assert attribute(steps, FakeClock())[1]["data_wait"] == 0.25


def test_micro_steps_add_up_per_phase():
    marks = [0.0, 1.0, 3.0, 4.0, 6.0, 7.0]  # two (forward, backward) pairs, then the optimizer
    phases = attribute([StepMarks(0.0, marks)], FakeClock())
    assert phases[0]["forward"] == 2.0 and phases[0]["backward"] == 4.0
    assert phases[0]["optimizer"] == 1.0 and phases[0]["total"] == 7.0


def test_cpu_feed_passes_batches_through_without_copies():
    batches = iter([{"x": torch.ones(2)}, {"x": torch.zeros(2)}, {"x": torch.ones(1)}])
    feed = DeviceFeed(batches, torch.device("cpu"))
    taken, copies = feed.take(2)
    assert [b["x"].tolist() for b in taken] == [[1.0, 1.0], [0.0, 0.0]] and copies == []
    assert HostClock().on_device is False


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
