"""Data wait, booked where it belongs, on an injected fake clock (no sleeps, no thresholds).

The real timed loop (`worker.trial`) and the real feed (`worker.feed.DeviceFeed`) run against a
virtual timeline the test advances: fetching a batch costs FETCH_S, a forward STEP_S, and a
synchronize leaves the device idle for SYNC_S while the host comes back from it. Each figure
is then exact. Also here: a batch spanning two Ray Data chunks is joined into a pinned buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from trial_runner import PARAMS, launch_config, run, trial_config

from amdahl.data.storage import arrow_column
from amdahl.worker.feed import DeviceFeed
from amdahl.worker.input import LaunchStream
from workloads.mlp import MLP

# Binary fractions: every sum of them is exact, so the figures compare with ==.
FETCH_S = 0.25
STEP_S = 0.5
SYNC_S = 4.0


class VirtualTime:
    """One timeline for host and device, as on CPU: a mark is the time now, and `synchronize`
    is a span in which the device sits idle because the harness stopped (SYNC_S)."""

    on_device = False

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def mark(self) -> float:
        return self.now

    def span(self, a: float, b: float) -> float:
        return b - a

    def synchronize(self) -> None:
        self.advance(SYNC_S)


CLOCK = VirtualTime()


class _Timed(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CLOCK.advance(STEP_S)
        return self.inner(x)


class VirtualMLP(MLP):
    """The MLP on the virtual timeline: each training batch takes FETCH_S to preprocess, each
    forward STEP_S."""

    def build_model(self) -> nn.Module:
        return _Timed(super().build_model())

    def preprocess(self, batch: dict, training: bool) -> dict:
        if training:
            CLOCK.advance(FETCH_S)
        return batch


def _virtual_trial(monkeypatch, **train) -> dict:
    monkeypatch.setattr("amdahl.worker.trial.clock_for", lambda device_type: CLOCK)
    trial = trial_config()
    stats, error, _ = run(
        VirtualMLP(**PARAMS), torch.device("cpu"), launch_config((trial,), **train)
    )
    assert error is None, error
    return stats


# --------------------------------------------------------------------------- the timed loop


def test_the_windows_opening_synchronize_is_not_the_first_measured_steps_data_wait(monkeypatch):
    stats = _virtual_trial(monkeypatch, steps=6, warmup_steps=2)
    waits = stats["history"]["data_wait_s"]
    # Every step after the first fetches one batch (FETCH_S) and nothing else between steps;
    # the synchronize before step 2 (SYNC_S of idle device) is the harness's, not the input's.
    assert waits[1:] == [FETCH_S] * 7
    assert stats["data_wait_s"] == FETCH_S
    assert stats["step_time_s"] == STEP_S


def test_after_a_validation_pass_the_next_fetch_is_the_data_wait(monkeypatch):
    target = {"metric": "val_loss", "value": -1.0, "max_steps": 8, "eval_every": 2}
    stats = _virtual_trial(monkeypatch, warmup_steps=2, target=target)
    # Validation after steps 3, 5 and 7 (its forwards and synchronize on the same timeline).
    assert stats["history"]["data_wait_s"][1:] == [FETCH_S] * 7
    assert stats["data_wait_s"] == FETCH_S


# --------------------------------------------------------------------------- the feed


class _Host:
    """Host batches whose fetch costs `costs[i]` on the virtual timeline."""

    def __init__(self, clock: VirtualTime, costs: list[float]):
        self.clock, self.costs, self.fetched = clock, costs, 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i, cost in enumerate(self.costs):
            self.clock.advance(cost)
            self.fetched = i + 1
            yield {"x": torch.full((2,), float(i))}


def _steps(feed: DeviceFeed, clock: VirtualTime, micro: int, steps: int) -> list[tuple]:
    """The loop's use of the feed: take a step's batches, compute, prefetch the next step's.
    Returns per step (host wait booked, seconds spent in take, the batches' values)."""
    out = []
    for _ in range(steps):
        start = clock.now
        taken = feed.take(micro)
        in_take = clock.now - start
        clock.advance(STEP_S)
        feed.prefetch(micro)
        out.append((taken.host_wait, in_take, [b["x"][0].item() for b in taken.batches]))
    return out


def test_each_step_is_booked_the_host_wait_of_its_own_batches():
    clock = VirtualTime()
    costs = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]  # batch i costs 2**i: sums identify
    feed = DeviceFeed(iter(_Host(clock, costs)), torch.device("cpu"), ahead=True, now=clock.mark)
    steps = _steps(feed, clock, micro=2, steps=3)
    assert [s[2] for s in steps] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert [s[0] for s in steps] == [1.0 + 2.0, 4.0 + 8.0, 16.0 + 32.0]


def test_every_micro_batch_of_the_next_step_is_fetched_while_this_one_computes():
    clock = VirtualTime()
    host = _Host(clock, [FETCH_S] * 12)
    feed = DeviceFeed(iter(host), torch.device("cpu"), ahead=True, now=clock.mark)
    steps = _steps(feed, clock, micro=3, steps=3)
    # Only the first step waits in take; later steps find all three micro-batches fetched
    # (on CUDA: copied on the side stream during the step before).
    assert [s[1] for s in steps] == [3 * FETCH_S, 0.0, 0.0]
    assert host.fetched == 12  # three steps, and the fourth step's batches ahead


def test_on_cpu_a_steps_batches_are_fetched_when_taken():
    clock = VirtualTime()
    host = _Host(clock, [1.0, 2.0, 4.0, 8.0])
    feed = DeviceFeed(iter(host), torch.device("cpu"), now=clock.mark)
    steps = _steps(feed, clock, micro=2, steps=2)
    assert [(s[0], s[1]) for s in steps] == [(3.0, 3.0), (12.0, 12.0)]
    assert host.fetched == 4  # nothing fetched ahead where it buys nothing


# --------------------------------------------------------------------------- joined batches


class _Shard:
    """Ray Data's `iter_batches(batch_format="pyarrow")` over `rows` rows in chunks of
    `batch_size` rows (a 2-column fixed-size-list column, as the stored rows are)."""

    def __init__(self, rows: int):
        self.rows = rows

    def iter_batches(self, batch_size: int, batch_format: str, **_: object):
        assert batch_format == "pyarrow"
        for start in range(0, self.rows, batch_size):
            stop = min(start + batch_size, self.rows)
            x = np.arange(start, stop).reshape(-1, 1).repeat(2, axis=1)
            yield pa.table({"x": arrow_column(x)})


def _stream_batches(monkeypatch, pin: bool, batches: int) -> tuple[list, list[tuple[int, bool]]]:
    """`batches` batches of 3 rows from a LaunchStream over 5-row chunks, and the (rows, pinned)
    of every host buffer it asked for."""
    asked: list[tuple[int, bool]] = []

    def buffer(shape, dtype, pin_memory):
        asked.append((shape[0], pin_memory))
        return torch.empty(shape, dtype=dtype)  # no CUDA here: tests/gpu pins for real

    monkeypatch.setattr("amdahl.worker.input._host_buffer", buffer)
    stream = LaunchStream(_Shard(100), chunk=5, prefetch_chunks=0, pin=pin)
    it = stream.batches(3)
    return [next(it) for _ in range(batches)], asked


def test_a_batch_spanning_two_chunks_is_joined_into_a_buffer_pinned_as_the_chunks_are(
    monkeypatch,
):
    out, asked = _stream_batches(monkeypatch, pin=True, batches=5)
    rows = [b["x"][:, 0].tolist() for b in out]
    assert rows == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]]
    assert all(b["x"].shape == (3, 2) for b in out)
    # For a GPU each 5-row chunk is copied once into pinned memory as it arrives, and batches
    # 1 and 3, spanning chunks [0, 5) | [5, 10) and [5, 10) | [10, 15), get a pinned 3-row
    # buffer each.
    assert asked == [(5, True), (5, True), (3, True), (5, True), (3, True)]
    _, unpinned = _stream_batches(monkeypatch, pin=False, batches=5)
    assert unpinned == [(3, False), (3, False)]  # on CPU: only the joins copy
