"""The profiler pass: a few training steps under torch.profiler after a trial's measured window,
on every rank of a multi-device trial, kept as a compressed Chrome trace for the driver.

Why: the measured window gives exposed communication but not how much of the all-reduce ran
hidden behind backward, nor which rank the others wait for; a per-rank trace does
(analysis/overlap.py reads it on the driver; docs/architecture.md, "Traces and overlap").
The pass never runs inside the measured window, and its seconds are recorded apart
(`profile_s`). `train.profile_steps` sets its length (0: off; which trials run it:
protocol.sizing.profiles): one unrecorded step first (the profiler's own warm-up), then the
recorded ones. On a GPU the device's kernels are recorded (CUPTI), so NCCL's kernels show; on a
CPU, gloo's collectives show as annotations on gloo's threads.

A trace travels as bytes, gzip-compressed, through the driver's work queue
(`WorkQueue.attach`), never through a shared filesystem; one larger than MAX_TRACE_BYTES is
not kept (`trace_error` says so).
"""

from __future__ import annotations

import gzip
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from amdahl.protocol.sizing import PROFILE_WARMUP

#: The largest compressed trace one rank ships to the driver (the queue actor holds it until
#: the driver takes it, a fraction of a second later).
MAX_TRACE_BYTES = 32 * 2**20


@dataclass(frozen=True)
class ProfiledTrace:
    """What the pass leaves: the compressed trace (None when it could not be kept), the pass's
    seconds on this rank (steps, export and compression), and why there is no trace."""

    blob: bytes | None
    seconds: float
    error: str | None = None


def profile_steps_pass(
    step: Callable[[int], None], steps: int, device: torch.device, first_step: int = 0
) -> ProfiledTrace:
    """Run `step(first_step + i)` for PROFILE_WARMUP + `steps` steps, the last `steps` under
    torch.profiler, and return the compressed Chrome trace.

    A failure of the step itself propagates (the trial's failure, as in its loop); a failure to
    profile or export does not: the steps still run, so every rank runs the same collectives,
    and the trace is None with the reason."""
    from torch.profiler import ProfilerActivity, profile, schedule

    start = time.perf_counter()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    plan = schedule(wait=0, warmup=PROFILE_WARMUP, active=steps, repeat=1)
    try:
        profiler = profile(activities=activities, schedule=plan)
        profiler.start()
    except Exception as e:  # noqa: BLE001 - no trace, the trial goes on
        return _unprofiled(step, steps, first_step, start, f"profiler did not start: {e}")
    try:
        for i in range(PROFILE_WARMUP + steps):
            step(first_step + i)
            profiler.step()
    finally:
        profiler.stop()
    try:
        blob = _compressed_trace(profiler)
    except Exception as e:  # noqa: BLE001 - no trace, the trial's figures stand
        return ProfiledTrace(None, time.perf_counter() - start, f"trace export failed: {e}")
    if len(blob) > MAX_TRACE_BYTES:
        reason = (
            f"trace of {len(blob) / 2**20:.1f} MiB compressed is over the "
            f"{MAX_TRACE_BYTES / 2**20:.0f} MiB a rank ships; lower train.profile_steps"
        )
        return ProfiledTrace(None, time.perf_counter() - start, reason)
    return ProfiledTrace(blob, time.perf_counter() - start)


def _unprofiled(
    step: Callable[[int], None], steps: int, first_step: int, start: float, reason: str
) -> ProfiledTrace:
    for i in range(PROFILE_WARMUP + steps):
        step(first_step + i)
    return ProfiledTrace(None, time.perf_counter() - start, reason)


def _compressed_trace(profiler: torch.profiler.profile) -> bytes:
    """The profiler's Chrome trace, gzip-compressed (the export writes a file: a private
    temporary one, removed at once)."""
    fd, path = tempfile.mkstemp(prefix="amdahl-trace-", suffix=".json")
    os.close(fd)
    try:
        profiler.export_chrome_trace(path)
        with open(path, "rb") as f:
            return gzip.compress(f.read(), compresslevel=6)
    finally:
        os.unlink(path)
