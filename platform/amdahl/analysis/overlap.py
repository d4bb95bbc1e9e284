"""Communication/computation overlap and the straggler rank, read from the per-rank Chrome traces
that the profiler pass writes (worker/profile.py; docs/architecture.md, "Traces and overlap").

Exposed communication (`comm_s`, the report's sync-none difference) says how much the all-reduce
cost; it cannot say how much of it ran hidden behind backward, nor which rank the others waited
for. A trace can. The figures, per rank, follow Holistic Trace Analysis (HTA,
`CommunicationAnalysis.get_comm_comp_overlap`):

- events are classified (`classify`): on a GPU trace the device's kernels, NCCL's
  (`ncclKernel_*`, `ncclDevKernel_*`) as communication, Memcpy/Memset as memory, names ending
  in `Sync` as neither, every other kernel as computation; on a CPU trace (gloo) gloo's
  collectives (`gloo:all_reduce`, annotations on gloo's own threads) as communication and every
  operator on the other threads (`cpu_op`, the forward/backward/optimizer work) as computation,
  c10d's enqueue calls (`c10d::*`, `record_param_comms`) excepted;
- each class's intervals are merged into their union; overlapped = |communication ∩
  computation|, and overlap = overlapped / |communication|: the share of the communication time
  during which some computation ran too (1: wholly hidden; 0: the step waited on every bit);
- exposed = |communication| - overlapped: communication with nothing else running.

The straggler: in a synchronous collective every rank leaves the all-reduce at about the same
time, so the rank that arrives last waits least, and the others wait for it. The straggler is
the rank with the least exposed communication per step; `straggler_s` is how much longer the
other ranks wait (the median of their exposed communication minus the straggler's): per step,
the time its lateness costs every other rank. Both use each rank's own clock only (durations),
so ranks on different nodes need no synchronised clocks. With one rank, or no communication
in the traces, there is none.

On a CPU the "computation" runs on the same cores as gloo's threads: overlapped there means
concurrent in time, not free. Pure Python over the parsed JSON: imports neither torch nor ray.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COMM = "communication"
COMPUTE = "computation"
MEMORY = "memory"

#: Device-side event categories of a torch.profiler (Kineto) trace.
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Not computation on a GPU (HTA's `is_compute_kernel`): NCCL, copies and sets, syncs.
_NOT_COMPUTE_KERNEL = re.compile(r"(^nccl)|(Memcpy)|(Memset)|(Sync$)")
#: CPU operators that only hand a collective to the backend (its time is the collective's).
_COMM_CALLS = ("c10d::", "record_param_comms", "gloo:", "nccl:")
_STEP = re.compile(r"^ProfilerStep\s*#\s*\d+$")


def is_device_trace(trace: Mapping[str, Any]) -> bool:
    """Whether the trace holds device (GPU) activity: then only kernels count, as in HTA."""
    if trace.get("deviceProperties"):
        return True
    return any(e.get("cat") in _DEVICE_CATEGORIES for e in _events(trace))


def classify(
    event: Mapping[str, Any], device: bool, comm_threads: frozenset = frozenset()
) -> str | None:
    """COMM, COMPUTE, MEMORY or None (not counted) for one complete ("X") event of a trace.

    `device`: the trace's rank ran on a GPU (`is_device_trace`); `comm_threads`: on a CPU
    trace, the threads that carry gloo's collectives (`_comm_threads`), whose operators are the
    collective's own work."""
    name, cat = str(event.get("name", "")), event.get("cat")
    if device:
        if cat not in _DEVICE_CATEGORIES:
            return None
        if name.startswith("nccl"):
            return COMM
        if cat != "kernel" or name.startswith(("Memcpy", "Memset")):
            return MEMORY
        return COMPUTE if not _NOT_COMPUTE_KERNEL.search(name) else None
    if name.startswith("gloo:"):
        return COMM
    if cat == "cpu_op" and event.get("tid") not in comm_threads:
        return None if name.startswith(_COMM_CALLS) else COMPUTE
    return None


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def total(merged: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merged)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged interval lists (`merge`)."""
    i = j = 0
    length = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        length += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return length


@dataclass(frozen=True)
class RankFigures:
    """One rank's profiled steps: seconds of communication (the union of its collectives),
    of it overlapped by computation, and the number of profiled steps."""

    rank: int
    comm_s: float
    overlapped_s: float
    steps: int

    @property
    def overlap(self) -> float | None:
        """HTA's overlap: overlapped / communication; None without communication."""
        return self.overlapped_s / self.comm_s if self.comm_s > 0 else None

    @property
    def exposed_per_step(self) -> float:
        return (self.comm_s - self.overlapped_s) / self.steps

    @property
    def comm_per_step(self) -> float:
        return self.comm_s / self.steps


def rank_figures(trace: Mapping[str, Any], rank: int) -> RankFigures:
    """One rank's figures from its parsed Chrome trace (times in microseconds, as written)."""
    events = [e for e in _events(trace) if e.get("ph") == "X" and "dur" in e]
    device = is_device_trace(trace)
    threads = _comm_threads(events) if not device else frozenset()
    spans: dict[str, list[tuple[float, float]]] = {COMM: [], COMPUTE: []}
    for e in events:
        kind = classify(e, device, threads)
        if kind in spans:
            start = float(e["ts"])
            spans[kind].append((start, start + float(e["dur"])))
    comm, compute = merge(spans[COMM]), merge(spans[COMPUTE])
    # The profiler's step annotations, counted by name: a GPU trace holds each one twice (the
    # host's `user_annotation` and its `gpu_user_annotation` copy on the device timeline). A
    # trace without them (not the pass's) counts as one step.
    steps = len({str(e["name"]) for e in events if _STEP.match(str(e.get("name", "")))})
    info = trace.get("distributedInfo") or {}
    own_rank = info.get("rank") if isinstance(info.get("rank"), int) else rank
    return RankFigures(
        own_rank, total(comm) / 1e6, intersection(comm, compute) / 1e6, max(steps, 1)
    )


@dataclass(frozen=True)
class TraceFigures:
    """The results columns a trial's traces give (None where they cannot say)."""

    comm_trace_s: float | None
    comm_overlap: float | None
    straggler_rank: int | None
    straggler_s: float | None

    def columns(self) -> dict[str, Any]:
        return {
            "comm_trace_s": self.comm_trace_s,
            "comm_overlap": self.comm_overlap,
            "straggler_rank": self.straggler_rank,
            "straggler_s": self.straggler_s,
        }


NO_FIGURES = TraceFigures(None, None, None, None)


def trace_figures(ranks: list[RankFigures]) -> TraceFigures:
    """A trial's columns from its ranks' figures: communication per step and overlap, the
    medians over the ranks with communication; the straggler and what it costs the others
    (module docstring)."""
    talking = [r for r in ranks if r.comm_s > 0]
    if not talking:
        return NO_FIGURES
    comm = statistics.median(r.comm_per_step for r in talking)
    overlap = statistics.median(r.overlap for r in talking if r.overlap is not None)
    straggler = straggler_s = None
    if len(talking) > 1:
        late = min(talking, key=lambda r: (r.exposed_per_step, r.rank))
        others = [r.exposed_per_step for r in talking if r is not late]
        straggler, straggler_s = late.rank, statistics.median(others) - late.exposed_per_step
    return TraceFigures(comm, overlap, straggler, straggler_s)


def read_trace(blob: bytes) -> dict[str, Any]:
    """A Chrome trace from its bytes, gzip-compressed (as the profiler pass ships it) or not."""
    data = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    trace = json.loads(data)
    if not isinstance(trace, dict):
        raise ValueError("not a Chrome trace (expected a JSON object with traceEvents)")
    return trace


def _events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    events = trace.get("traceEvents") or []
    return [e for e in events if isinstance(e, dict)]


def _comm_threads(events: list[dict[str, Any]]) -> frozenset:
    """The threads that run gloo's collectives (gloo's own worker threads)."""
    return frozenset(e.get("tid") for e in events if str(e.get("name", "")).startswith("gloo:"))


def straggler_of(rows: Iterable[Mapping[str, Any]]) -> tuple[int, float] | None:
    """A configuration's straggler over its repeats: the rank its rows name most often (the
    lowest on a tie) and the median of those rows' `straggler_s`; None when no row names one."""
    named: dict[int, list[float]] = {}
    for r in rows:
        rank, wait = r.get("straggler_rank"), r.get("straggler_s")
        if isinstance(rank, int) and isinstance(wait, (int, float)):
            named.setdefault(rank, []).append(float(wait))
    if not named:
        return None
    rank = min(named, key=lambda k: (-len(named[k]), k))
    return rank, statistics.median(named[rank])
