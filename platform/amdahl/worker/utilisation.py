"""How busy each rank's processor was during the measured window, sampled in the background.

A daemon thread wakes every `interval` seconds and records, against seconds since the window
opened, this process's CPU use (user + system seconds over wall seconds, as a percentage of the
cores the process may run on, so 100 means every allowed core was busy) and, on CUDA, the GPU's
utilisation as NVML reports it (the share of the last sample period in which a kernel ran) and
the memory torch holds. The driver logs these as MLflow system metrics (`system/rank<k>/...`),
beside the run's other charts (docs/architecture.md, "Utilisation").

Why a thread and not per-step marks: the timed loop stays free of bookkeeping, and one wake-up
every quarter second costs microseconds. Samples beyond `MAX_SAMPLES` are thinned by dropping
every other one and doubling the interval, so a long trial stays a few kilobytes.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from typing import Any

import torch

#: Seconds between samples at the start of a window.
INTERVAL_S = 0.25
#: At most this many samples leave the worker (even); at it, the interval doubles.
MAX_SAMPLES = 400


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def gpu_reader(device: torch.device):
    """A function returning (utilisation %, MiB allocated) for a CUDA `device`, or None where
    NVML is not there (no nvidia-ml-py, or no driver): then only memory is sampled."""
    if device.type != "cuda":
        return None

    def memory() -> float:
        return torch.cuda.memory_allocated(device) / 2**20

    try:
        torch.cuda.utilization(device)  # imports pynvml and opens NVML once, here
    except Exception:  # no nvidia-ml-py, no NVML, or a MIG slice NVML cannot read
        return lambda: (None, memory())
    return lambda: (float(torch.cuda.utilization(device)), memory())


class UtilisationSampler:
    """Samples from `start()` to `stop()`; `series()` gives the samples as plain lists."""

    def __init__(self, device: torch.device, interval: float = INTERVAL_S) -> None:
        self._gpu = gpu_reader(device)
        self._cores = allowed_cores()
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t: list[float] = []
        self._cpu: list[float] = []
        self._gpu_util: list[float | None] = []
        self._gpu_mib: list[float] = []

    def start(self) -> None:
        self._t0 = self._last_wall = time.perf_counter()
        self._last_cpu = _cpu_seconds()
        self._thread = threading.Thread(target=self._run, name="amdahl-utilisation", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; takes one last sample so a window shorter than the interval has one."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self) -> None:
        now, cpu = time.perf_counter(), _cpu_seconds()
        wall = now - self._last_wall
        if wall <= 0:
            return
        self._t.append(now - self._t0)
        self._cpu.append(100.0 * (cpu - self._last_cpu) / wall / self._cores)
        self._last_wall, self._last_cpu = now, cpu
        if self._gpu is not None:
            util, mib = self._gpu()
            self._gpu_util.append(util)
            self._gpu_mib.append(mib)
        if len(self._t) >= MAX_SAMPLES:  # even, so every sample has a partner
            self._thin()

    def _thin(self) -> None:
        """Keep every other sample, CPU averaged over the two periods it now stands for (weighted
        by their lengths); double the interval so the rest of the window is sampled at the new
        rate."""
        pairs = range(1, len(self._t), 2)
        ends = [0.0, *self._t]
        length = lambda i: ends[i + 1] - ends[i]  # noqa: E731
        self._cpu = [
            (self._cpu[i - 1] * length(i - 1) + self._cpu[i] * length(i))
            / (length(i - 1) + length(i))
            for i in pairs
        ]
        self._t = [self._t[i] for i in pairs]
        if self._gpu is not None:
            self._gpu_util = [self._gpu_util[i] for i in pairs]
            self._gpu_mib = [self._gpu_mib[i] for i in pairs]
        self._interval *= 2

    def series(self) -> dict[str, Any]:
        """{"t": seconds since start, "cpu_percent": [...], and on CUDA "gpu_percent" (None
        where NVML is missing) and "gpu_mib"}; numbers rounded to 4 significant figures."""
        short = lambda v: None if v is None or not math.isfinite(v) else float(f"{v:.4g}")  # noqa: E731
        out: dict[str, Any] = {
            "t": [short(v) for v in self._t],
            "cpu_percent": [short(v) for v in self._cpu],
        }
        if self._gpu is not None:
            out["gpu_percent"] = [short(v) for v in self._gpu_util]
            out["gpu_mib"] = [short(v) for v in self._gpu_mib]
        return out


def utilisation_columns(per_rank: list[dict[str, Any] | None]) -> dict[str, Any]:
    """The results columns from every rank's `series()` (None for a rank that sent none): the
    samples as JSON, and the window's CPU and GPU busy share, time-weighted per rank, median
    over ranks."""
    cpu = [m for m in (_window_mean(s, "cpu_percent") for s in per_rank) if m is not None]
    gpu = [m for m in (_window_mean(s, "gpu_percent") for s in per_rank) if m is not None]
    return {
        "utilisation": json.dumps(per_rank, separators=(",", ":")),
        "cpu_utilisation": statistics.median(cpu) if cpu else None,
        "gpu_utilisation": statistics.median(gpu) if gpu else None,
    }


def _window_mean(series: dict[str, Any] | None, key: str) -> float | None:
    """Time-weighted mean of one series: each sample stands for the period since the one
    before it (the first for the period since the window opened)."""
    if not series or not series.get(key):
        return None
    pairs = [(t, v) for t, v in zip(series["t"], series[key], strict=True) if t is not None]
    starts = [0.0] + [t for t, _ in pairs[:-1]]
    weighted = [(t - s, v) for (t, v), s in zip(pairs, starts, strict=True) if v is not None]
    total = sum(w for w, _ in weighted)
    return sum(w * v for w, v in weighted) / total if total > 0 else None
