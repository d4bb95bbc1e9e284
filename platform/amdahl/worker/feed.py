"""Host batches onto the training device, one batch ahead, on a copy stream of their own.

Worker side. On CUDA, a `non_blocking` copy queued on the compute stream right before a step
runs after the previous step's kernels and before this step's: it never overlaps compute, and
between two steps' timing events it is counted nowhere. `DeviceFeed` instead issues the copy of
batch i+1 on a side stream as soon as batch i is handed out, so it runs while step i computes;
the compute stream waits on the copy's end event before using the batch (a wait that shows up
in the step's data wait when the copy is late), and `record_stream` tells the caching allocator
that the batch is used on the compute stream. The copy's own events give the transfer time.

On CPU the batches pass through untouched (host and device are one memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


class DeviceFeed:
    """`next(feed)` gives a batch already on `device`; `last_copy` holds its copy's (start, end)
    events on CUDA, None on CPU."""

    def __init__(self, host_batches: Iterator[Batch], device: torch.device):
        self._host = host_batches
        self._device = device
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        self._ahead: tuple[Batch, Batch, Any] | None = None  # (host, device, copy events)
        self._in_use: Batch | None = None  # host tensors of the batch handed out last
        self.last_copy: tuple[Any, Any] | None = None

    def __iter__(self) -> DeviceFeed:
        return self

    def take(self, n: int) -> tuple[list[Batch], list[tuple[Any, Any]]]:
        """The next `n` batches, and the copy events of those that were copied."""
        batches, copies = [], []
        for _ in range(n):
            batches.append(next(self))
            if self.last_copy is not None:
                copies.append(self.last_copy)
        return batches, copies

    def __next__(self) -> Batch:
        if self._ahead is None:
            self._ahead = self._issue()
        host, batch, copy = self._ahead
        if copy is not None:
            compute = torch.cuda.current_stream(self._device)
            compute.wait_event(copy[1])
            for tensor in batch.values():
                tensor.record_stream(compute)
        # Pinned host memory must outlive its asynchronous copy: hold it one batch longer.
        self._in_use, self.last_copy = host, copy
        self._ahead = self._issue()
        return batch

    def _issue(self) -> tuple[Batch, Batch, Any]:
        host = next(self._host)
        if not self._cuda:
            return host, host, None
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            start.record(self._stream)
            batch = {k: v.to(self._device, non_blocking=True) for k, v in host.items()}
            end.record(self._stream)
        return host, batch, (start, end)
