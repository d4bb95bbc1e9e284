"""Step clocks and the attribution of each training step's time to its phases.

Worker side. The harness puts marks into a clock as a step runs: per step
`[start, (after forward, after backward) per micro-step, end]`, plus the copy marks of the
batches it consumed. A clock is either the host's (`HostClock`: `perf_counter`, exact on CPU
where work is synchronous) or the device's (`CudaClock`: CUDA events, read once after one
synchronize at the end of the trial, so timing never stalls the queue).

`attribute` turns the marks into phases. It only subtracts marks through `clock.span`, so a test
drives it with a fake timeline (`FakeClock` in the tests) and checks each second lands where it
belongs. Definitions (docs/architecture.md, "What a step's columns mean"):

- data wait = the time the device sat idle between the previous step's end and this step's
  start. On a GPU the host runs ahead of the device, so a host-side wait for input is hidden
  whenever the GPU is the bottleneck; only the device's idle gap costs throughput. The gap also
  holds the wait for the batch's host-to-device copy when that copy did not finish in time.
  Spans in which the harness itself held the device (`StepMarks.held`: the synchronize that
  opens the measured window, a validation pass) are cut out of the gap: the device idles there
  because the harness stopped, not for input. The first step has no gap; its host wait stands in.
- host data wait = host seconds inside the input iterator fetching this step's own batches
  (`feed.Taken.host_wait`); kept apart for diagnosis.
- transfer = device seconds copying the step's input to the device, on the copy stream; it
  overlaps the previous step's compute, so it is not part of the step time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class StepMarks:
    """One step's raw marks, resolved after the trial by `attribute`."""

    host_wait: float
    marks: list[Any]
    copies: list[tuple[Any, Any]] = field(default_factory=list)
    #: (pause, resume) marks around each span between the previous step and this one in which
    #: the harness held the device for something that is not input (`hold`)
    held: list[tuple[Any, Any]] = field(default_factory=list)


class StepClock(Protocol):
    """What the harness needs of a clock."""

    on_device: bool

    def mark(self) -> Any: ...

    def span(self, a: Any, b: Any) -> float: ...

    def synchronize(self) -> None: ...


class HostClock:
    """`perf_counter` marks: exact where the work is synchronous (CPU)."""

    on_device = False

    def mark(self) -> float:
        return time.perf_counter()

    def span(self, a: float, b: float) -> float:
        return b - a

    def synchronize(self) -> None:
        return None


class CudaClock:
    """CUDA events on the current stream; `span` is valid once `synchronize` has returned."""

    on_device = True

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def mark(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()


def clock_for(device_type: str) -> StepClock:
    return CudaClock() if device_type == "cuda" else HostClock()


@contextmanager
def hold(clock: StepClock, held: list[tuple[Any, Any]]) -> Iterator[None]:
    """Synchronize, and run the block (a validation pass) between two steps; the (pause, resume)
    marks around it go into `held`, for the next step's `StepMarks.held`, and `attribute` cuts
    that span out of the next step's gap. The pause mark is queued before the synchronize and
    after the input work the host did for the next step (`DeviceFeed.prefetch`), so a host that
    was late with that input still shows as data wait."""
    pause = clock.mark()
    clock.synchronize()
    yield
    held.append((pause, clock.mark()))


def attribute(steps: list[StepMarks], clock: StepClock) -> list[dict[str, float]]:
    """Per step: forward, backward, optimizer, total (start to end), data_wait, host_wait and
    transfer (0 where batches were not copied), in seconds. Call after `clock.synchronize()`."""
    out: list[dict[str, float]] = []
    previous_end: Any = None
    for step in steps:
        m = step.marks
        spans = [clock.span(a, b) for a, b in zip(m[:-1], m[1:], strict=True)]
        if previous_end is None:
            wait = step.host_wait
        else:
            edges = [previous_end, *(mark for pair in step.held for mark in pair), m[0]]
            idle = zip(edges[0::2], edges[1::2], strict=True)
            wait = sum(max(0.0, clock.span(a, b)) for a, b in idle)
        out.append(
            {
                "forward": sum(spans[0:-1:2]),
                "backward": sum(spans[1:-1:2]),
                "optimizer": spans[-1],
                "total": clock.span(m[0], m[-1]),
                "data_wait": wait,
                "host_wait": step.host_wait,
                "transfer": sum(clock.span(a, b) for a, b in step.copies),
            }
        )
        previous_end = m[-1]
    return out
