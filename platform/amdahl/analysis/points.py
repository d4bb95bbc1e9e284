"""Measured points: a configuration as the step-time model sees it, the medians over its ok
repeats split into the terms the model fits (busy seconds per step, data wait and, where the
trial gives one, a compute observation), and the family it belongs to.

A compute observation comes from 1-device trials and `sync: none` trials (their whole step minus
data wait: no communication) and from multi-device trials of strategies whose exposed
communication the harness measures (`comm_s`, DDP-based: their step minus data wait minus
`comm_s`).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from amdahl import strategies
from amdahl.analysis.comm import communicates
from amdahl.analysis.configs import SETTINGS, Config

#: The settings that make a family: all but devices, the batch and the trial id.
FAMILY_SETTINGS = tuple(c for c in SETTINGS if c not in ("batch_size", "trial"))
#: Strategies whose whole communication the harness's `comm_s` measures (DDP's all-reduce and
#: its hooks): their multi-device trials give compute observations. From the strategy table.
COMM_S_COVERS = frozenset(n for n, s in strategies.STRATEGIES.items() if s.comm_s_covers)


@dataclass(frozen=True)
class Point:
    """One measured configuration as the model sees it (medians over its ok repeats)."""

    config: Config
    family: tuple
    devices: int
    batch: float  # per device
    micro: float
    global_batch: float
    throughput: float
    busy_s: float  # seconds per step without data wait
    data_wait_s: float | None
    compute_s: float | None  # a compute observation, when this trial gives one
    nodes: int
    #: CPU seconds a rank spent per step (its busy share x host_cores x step), when recorded.
    host_cpu_s: float | None = None
    host_cores: float | None = None  # cores of rank 0's node (its affinity), when recorded


def family_key(settings: dict[str, Any]) -> tuple:
    """The family of a configuration (or of a row-shaped candidate): its FAMILY_SETTINGS."""
    return tuple(settings.get(c) for c in FAMILY_SETTINGS)


def family_micro_steps(settings: dict[str, Any], options: dict[str, Any]) -> int:
    """Passes per optimizer step of a family's settings (its `accumulate_steps` axis, or sync
    accumulate's option; 1 for a sync this build does not know): the compute a step holds,
    while its communication stays one per step, so accumulation divides it per sample."""
    if settings.get("sync") not in strategies.STRATEGIES:
        return 1
    return strategies.micro_steps(settings["sync"], options, settings.get("accumulate_steps") or 1)


def measured_point(c: Config) -> Point | None:
    """The configuration as the model sees it; None when it has no usable ok repeat."""
    if not c.ok or not c.batch_size or c.step_wall is None or c.throughput is None:
        return None
    wall = c.step_wall.median
    dw = c.stat("data_wait_s")
    wait = dw.median if dw else None
    busy = wall - (wait or 0.0)
    if busy <= 0:
        return None
    micro_stat = c.stat("micro_steps")
    micro = micro_stat.median if micro_stat else 1.0
    gb = c.stat("global_batch")
    p = c.devices
    compute = None
    if not communicates(c.sync, p):
        compute = busy
    elif c.sync in COMM_S_COVERS:
        comm = c.stat("comm_s")
        if comm is not None and busy - comm.median > 0:
            compute = busy - comm.median
    util, cores = c.stat("cpu_utilisation"), c.stat("host_cores")
    host_cpu = util.median / 100 * cores.median * wall if util and cores else None
    return Point(
        config=c,
        family=family_key(c.settings),
        devices=p,
        batch=float(c.batch_size),
        micro=micro,
        global_batch=gb.median if gb else c.batch_size * p * micro,
        throughput=c.throughput.median,
        busy_s=busy,
        data_wait_s=wait,
        compute_s=compute,
        nodes=nodes_of(c),
        host_cpu_s=host_cpu,
        host_cores=cores.median if cores else None,
    )


def nodes_of(c: Config) -> int:
    """The nodes a configuration's trials ran on (the median over its ok repeats; 1 if unknown)."""
    counts = []
    for r in c.ok_rows:
        try:
            ids = json.loads(r.get("nodes") or "[]")
        except ValueError:
            continue
        if isinstance(ids, list) and ids:
            counts.append(len({str(i) for i in ids}))
    return int(statistics.median(counts)) if counts else 1
