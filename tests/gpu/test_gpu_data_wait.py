"""Data wait's CUDA branches (tests/unit/worker/test_data_wait.py has the CPU and fake-clock
side): the window's opening synchronize and a validation pass are not data wait on the device
timeline, every micro-batch of the next step is copied while the current step computes, and a
batch joined from two Ray Data chunks is pinned, so that its copy is asynchronous, as are a
static shard's batches (`LocalShard`: each table pinned, ahead in a thread or inline)."""

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch
from trial_runner import PARAMS, SlowData, SlowForward, launch_config, run, trial_config

from amdahl.worker.feed import DeviceFeed
from amdahl.worker.input import LaunchStream, LocalShard, host_batches
from amdahl.worker.stepclock import CudaClock, StepMarks, attribute


class HiddenInput(SlowForward, SlowData):
    """GPU-bound: each forward keeps the GPU busy 40 ms, each batch costs the host 10 ms, a
    wait the host does while the GPU computes (hidden, so no data wait)."""

    FORWARD_S = 0.04
    DATA_S = 0.01


def test_the_windows_opening_synchronize_is_not_data_wait_on_the_device(cuda):
    # Four warmup steps: on an H200 the first three steps' gaps read about DATA_S with any
    # window (the host fell behind while its first pinned batches were allocated), so with
    # trial_runner's two the first measured step was still a warmup effect, not the window's.
    warm = 4
    trial = trial_config()
    stats, error, _ = run(HiddenInput(**PARAMS), cuda, launch_config((trial,), warmup_steps=warm))
    assert error is None, error
    waits = stats["history"]["data_wait_s"]
    # Before the fix, the host fetched the next batch after the synchronize and before the
    # first measured step's start: about DATA_S of device idle booked as data wait.
    assert waits[warm] < HiddenInput.DATA_S / 4, waits
    assert stats["data_wait_s"] < HiddenInput.DATA_S / 4
    assert stats["data_wait_host_s"] >= 0.8 * HiddenInput.DATA_S  # the host did wait


def test_a_validation_pass_is_not_data_wait_on_the_device(cuda):
    target = {"metric": "val_loss", "value": -1.0, "max_steps": 8, "eval_every": 2}
    trial = trial_config()
    launch = launch_config((trial,), target=target)
    stats, error, _ = run(HiddenInput(**PARAMS), cuda, launch)
    assert error is None, error
    assert max(stats["history"]["data_wait_s"][1:]) < HiddenInput.DATA_S / 4


def test_a_copy_slower_than_the_step_is_that_steps_data_wait(cuda):
    """A late copy shows as data wait (tests/unit/worker/test_attribution.py can only write the
    marks itself): 64 MiB pinned batches, already on the host, and a step of one tiny kernel, so
    the device's only reason to idle between steps is the copy. Without the compute stream's
    wait on the copy's end event in `DeviceFeed.take`, the step's start mark would be recorded
    at once and the gap would read about 0 (while the step read a half-copied batch)."""
    n = 16 * 2**20  # float32: 64 MiB per batch
    host = [{"x": torch.full((n,), float(i)).pin_memory()} for i in range(5)]
    feed, clock = DeviceFeed(iter(host), cuda), CudaClock()
    steps = []
    for _ in range(4):  # the fifth batch is only prefetched
        taken = feed.take(1)
        start = clock.mark()
        taken.batches[0]["x"][:1].add_(1.0)  # microseconds of device work
        marks = [start, clock.mark(), clock.mark(), clock.mark()]
        steps.append(StepMarks(taken.host_wait, marks, taken.copies))
        feed.prefetch(1)
    clock.synchronize()
    figures = attribute(steps, clock)
    for f in figures[1:]:  # the first step has no gap before it
        assert f["transfer"] > 4 * n / 1e12, f  # a real copy: under 1 TB/s
        assert f["data_wait"] >= 0.8 * f["transfer"], f
        assert f["total"] < f["transfer"] / 4, f


class _Counting:
    def __init__(self, batches):
        self.batches, self.fetched = batches, 0

    def __iter__(self):
        for batch in self.batches:
            self.fetched += 1
            yield batch


def test_every_micro_batch_is_copied_while_the_step_before_computes(cuda):
    host = _Counting([{"x": torch.full((1024,), float(i)).pin_memory()} for i in range(6)])
    feed = DeviceFeed(iter(host), cuda)
    first = feed.take(2)
    compute = torch.cuda.current_stream(cuda)
    busy_end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(0.05 * _cycles_per_second()))  # the step: 50 ms of GPU work
    busy_end.record(compute)
    feed.prefetch(2)  # the loop's call once the step is queued
    assert host.fetched == 4
    second = feed.take(2)
    assert host.fetched == 4  # nothing left to fetch at the next step's start
    torch.cuda.synchronize()
    assert [b["x"][0].item() for b in first.batches + second.batches] == [0.0, 1.0, 2.0, 3.0]
    assert len(second.copies) == 2
    for _, end in second.copies:  # both copies were done before the step's work was
        assert end.elapsed_time(busy_end) > 0


class _Shard:
    """Ray Data's Arrow chunks (`iter_batches(batch_format="pyarrow")`), pageable as the object
    store's are: the stream pins them itself."""

    def __init__(self, rows: int):
        self.rows = rows

    def iter_batches(self, batch_size: int, **_: object):
        for start in range(0, self.rows, batch_size):
            yield pa.table({"x": np.arange(start, min(start + batch_size, self.rows), dtype="f4")})


def test_a_batch_joined_from_two_chunks_is_pinned(cuda):
    stream = LaunchStream(_Shard(20), chunk=5, prefetch_chunks=0, pin=True)
    batches = stream.batches(3)
    plain, joined = next(batches), next(batches)  # rows [0, 3) and [3, 5) + [5, 6)
    assert plain["x"].is_pinned() and joined["x"].is_pinned()
    feed = DeviceFeed(iter([joined]), cuda)
    on_device = feed.take(1).batches[0]
    torch.cuda.synchronize()
    assert on_device["x"].tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize("prefetch", [0, 4])
def test_a_local_shards_batches_are_pinned_ahead_or_inline(cuda, prefetch):
    tables = [pa.table({"x": np.arange(a, a + 5, dtype="f4")}) for a in range(0, 20, 5)]
    batches = host_batches(LocalShard(tables, fetch_s=0.0), 3, prefetch=prefetch, pin=True)
    got = [next(batches) for _ in range(8)]  # 24 rows: the 20 rows, then around again
    assert all(b["x"].is_pinned() for b in got)  # views of a pinned table, or pinned joins
    assert [v for b in got for v in b["x"].tolist()] == [float(i % 20) for i in range(24)]
    pinning = [t for t in threading.enumerate() if t.name.startswith("amdahl-pin")]
    assert bool(pinning) == (prefetch > 0)
    batches.close()  # a trial's end stops the thread
    assert not any(t.is_alive() for t in pinning)


def _cycles_per_second() -> float:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).clock_rate * 1e3
