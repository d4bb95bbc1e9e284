"""Host batches onto the training device, a whole step ahead, on a copy stream of their own.

Worker side. On CUDA, a `non_blocking` copy queued on the compute stream right before a step
runs after the previous step's kernels and before this step's: it never overlaps compute, and
between two steps' timing events it is counted nowhere. `DeviceFeed` instead fetches the next
step's batches, every micro-batch of it, once this step's work is queued (`prefetch`), and
copies them on a side stream, so the copies run while this step computes; the compute stream
waits on each copy's end event when the batch is handed out (`take`, before the step's start
mark: a late copy shows up in the step's data wait), and `record_stream` tells the caching
allocator that the batch is used on the compute stream. The copies' own events give the
transfer time.

Fetching after the step's work, not before its start, keeps two things right (see
docs/architecture.md, "What a step's columns mean"): a host that is slow to produce batch i+1
leaves the device idle between step i and step i+1, where the gap is booked as step i+1's data
wait, and each step's host wait is the time spent fetching its own batches (`Taken.host_wait`),
wherever in the loop that time was spent.

On CPU the batches pass through untouched (host and device are one memory) and are fetched when
taken: fetching ahead buys nothing where the work is synchronous.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


@dataclass
class Taken:
    """One step's batches on the device, the copy events of those that were copied, and the
    host seconds spent inside the input iterator fetching exactly these batches."""

    batches: list[Batch] = field(default_factory=list)
    copies: list[tuple[Any, Any]] = field(default_factory=list)
    host_wait: float = 0.0


@dataclass
class _Fetched:
    host: Batch  # kept until the batch after it is handed out: pinned memory outlives its copy
    batch: Batch
    copy: tuple[Any, Any] | None
    wait: float


class DeviceFeed:
    """`take(n)` gives a step's `n` batches already on `device`; `prefetch(n)` fetches and
    copies the next step's. `ahead` (default: on CUDA) says whether batches are fetched ahead;
    `now` is the host clock the fetches are timed with."""

    def __init__(
        self,
        host_batches: Iterator[Batch],
        device: torch.device,
        *,
        ahead: bool | None = None,
        now: Callable[[], float] = time.perf_counter,
    ):
        self._host = host_batches
        self._device = device
        self._cuda = device.type == "cuda"
        self._ahead = self._cuda if ahead is None else ahead
        self._now = now
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._queue: deque[_Fetched] = deque()
        self._in_use: list[Batch] = []  # host tensors of the batches handed out last
        self.last_copy: tuple[Any, Any] | None = None

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> Batch:
        taken = self.take(1)
        self.prefetch(1)
        return taken.batches[0]

    def take(self, n: int) -> Taken:
        """The next `n` batches: those prefetched, and the rest fetched now."""
        while len(self._queue) < n:
            self._queue.append(self._fetch())
        handed = [self._queue.popleft() for _ in range(n)]
        taken = Taken()
        for item in handed:
            if item.copy is not None:
                compute = torch.cuda.current_stream(self._device)
                compute.wait_event(item.copy[1])
                for tensor in item.batch.values():
                    tensor.record_stream(compute)
                taken.copies.append(item.copy)
            taken.batches.append(item.batch)
            taken.host_wait += item.wait
        self._in_use = [item.host for item in handed]
        self.last_copy = handed[-1].copy if handed else None
        return taken

    def close(self) -> None:
        """Stop the host iterator now (its prefetch or pinning thread), not when collected."""
        close = getattr(self._host, "close", None)
        if close is not None:
            close()

    def peek(self) -> Batch:
        """The next batch, on the device, without handing it out (fetched now if none is
        ahead); usable on the compute stream."""
        if not self._queue:
            self._queue.append(self._fetch())
        item = self._queue[0]
        if item.copy is not None:
            compute = torch.cuda.current_stream(self._device)
            compute.wait_event(item.copy[1])
            for tensor in item.batch.values():
                tensor.record_stream(compute)
        return item.batch

    def prefetch(self, n: int) -> None:
        """When fetching ahead: fetch the next `n` batches and issue their copies now (call it
        once the current step's work is queued, so that they overlap it). Else nothing."""
        while self._ahead and len(self._queue) < n:
            self._queue.append(self._fetch())

    def _fetch(self) -> _Fetched:
        start = self._now()
        host = next(self._host)
        wait = self._now() - start
        if not self._cuda:
            return _Fetched(host, host, None, wait)
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            begin.record(self._stream)
            batch = {k: v.to(self._device, non_blocking=True) for k, v in host.items()}
            end.record(self._stream)
        return _Fetched(host, batch, (begin, end), wait)
