"""What each trial asks Ray for, and whether the cluster can ever hold it.

`trial_resources` turns a trial's settings into a `ResourcePlan` (the Tune trial's own CPU, the
train workers, the input pipeline's CPUs); `auto_resources` chooses the `resources` fields left
to auto so the largest trial fits; `resource_problem` refuses a trial these nodes could never
schedule, including the two hang cases of docs/architecture.md (Ray Data left with no CPU beside
the train workers, and the Tune trial's own default CPU).

Pure: imports neither ray nor torch. The cluster is described by `Node`s: the driver
(driver/cluster.py) reads them from Ray, the autoscaler's config or the local machine and passes
them in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from amdahl.columns import TrialSettings
from amdahl.plan.checks import capability_problem
from amdahl.spec.schema import SweepSpec

#: CPUs the Tune function trainable holds while it drives one launch. Ray rejects 0; a tiny
#: fraction keeps the trial from holding a whole CPU (docs/architecture.md, hang case b).
DRIVER_CPUS = 0.01


@dataclass(frozen=True)
class Node:
    """One Ray node's total resources, as the planner sees them."""

    cpus: float
    gpus: float = 0.0
    name: str = "node"


@dataclass(frozen=True)
class ResourcePlan:
    """What one trial asks Ray for."""

    driver_cpus: float
    workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    data_cpus: float

    @property
    def total_cpus(self) -> float:
        return self.driver_cpus + self.workers * self.cpus_per_worker + self.data_cpus

    @property
    def total_gpus(self) -> float:
        return self.workers * self.gpus_per_worker

    def describe(self) -> str:
        gpu = f" + {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        return (
            f"driver {self.driver_cpus:g} CPU, {self.workers} x ({self.cpus_per_worker:g} CPU"
            f"{gpu}), data {self.data_cpus:g} CPU = {self.total_cpus:g} CPU"
            + (f", {self.total_gpus:g} GPU" if self.total_gpus else "")
        )


def trial_resources(spec: SweepSpec, settings: TrialSettings) -> ResourcePlan:
    """What a trial with these settings asks Ray for, under `spec`'s (resolved) resources."""
    r = spec.resources
    return ResourcePlan(
        driver_cpus=DRIVER_CPUS,
        workers=settings.devices,
        cpus_per_worker=r.cpus_per_device,
        gpus_per_worker=r.gpus_per_device if r.use_gpu else 0.0,
        data_cpus=_data_workers_in_total(settings) * r.cpus_per_data_worker,
    )


def _data_workers_in_total(settings: TrialSettings) -> int:
    """ray_data: one preprocessing operator of `data_workers` tasks for all devices;
    torch_loader: a DataLoader with `data_workers` processes on every device."""
    if settings.input == "torch_loader":
        return settings.devices * settings.data_workers
    return settings.data_workers


#: resources: auto, on CPU: a train worker gets at most 1 CPU (a CPU "device" is one core, one
#: torch thread) and an input-pipeline worker 0.5, the defaults before auto existed (so sweeps
#: that fitted keep their trial ids); both shrink together when the largest trial would not fit.
AUTO_CPUS_PER_DEVICE = 1.0
AUTO_CPUS_PER_DATA_WORKER = 0.5
#: The furthest auto shrinks them (as a share of the values above): a trial that would need
#: less is left to its refusal rather than squeezing every other trial onto slivers of a CPU.
AUTO_MIN_SHARE = 0.25
#: resources: auto with use_gpu: CPUs of each GPU node left for Ray itself (the input
#: pipeline's tasks, the Tune trial) before the rest is divided among the node's GPUs.
AUTO_GPU_NODE_RESERVE = 1.0


def auto_resources(
    spec: SweepSpec,
    grid: list[TrialSettings],
    nodes: list[Node],
    cpus_per_device: float | None = None,
) -> tuple[SweepSpec, str | None]:
    """`spec` with `cpus_per_device` and `cpus_per_data_worker` chosen where left to auto, and
    a line saying what was chosen and why (None when both were set).

    CPU trials: the largest trial that can run at all (its train workers, its input workers
    and DRIVER_CPUS for the Tune trial) must fit the cluster's CPUs, so neither hang case
    (Ray Data left no CPU, the trial's own CPU) can arise from a default; both values shrink
    in proportion from AUTO_CPUS_PER_DEVICE / AUTO_CPUS_PER_DATA_WORKER, rounded down to
    0.01, no lower than AUTO_MIN_SHARE of them; `cpus_per_device`, where the workload states
    what a rank needs of its host (Workload.host_cpus_per_device), replaces
    AUTO_CPUS_PER_DEVICE. GPU trials: each worker gets its GPU node's
    CPUs, less AUTO_GPU_NODE_RESERVE (or the largest trial's input CPUs, if more), divided by
    the workers the node holds; the smallest GPU node type decides. A value the user set is
    kept as set, and `resource_problem` still refuses what does not fit.
    """
    r = spec.resources
    if r.cpus_per_device is not None and r.cpus_per_data_worker is not None:
        return spec, None
    runnable = [s for s in grid if capability_problem(spec, s) is None] or grid
    data = [_data_workers_in_total(s) for s in runnable]
    dw_auto = r.cpus_per_data_worker is None
    dev_auto = r.cpus_per_device is None
    dw = AUTO_CPUS_PER_DATA_WORKER if dw_auto else r.cpus_per_data_worker
    why = ""
    if r.use_gpu and dev_auto and any(n.gpus > 0 for n in nodes):
        reserve = max(AUTO_GPU_NODE_RESERVE, DRIVER_CPUS + max(data, default=1) * dw)
        per_worker = lambda n: (n.cpus - reserve) / (n.gpus / r.gpus_per_device)  # noqa: E731
        node = min((n for n in nodes if n.gpus > 0), key=per_worker)
        cpd = _round_down(max(per_worker(node), 0.01))
        why = f"({node.cpus:g} CPUs less {reserve:g} for Ray, over {node.gpus:g} GPUs"
        why += f" of {node.name})"
    else:
        c0 = (cpus_per_device or AUTO_CPUS_PER_DEVICE) if dev_auto else r.cpus_per_device
        budget = sum(n.cpus for n in nodes) - DRIVER_CPUS
        share = 1.0
        if nodes:
            fits = []
            for s, k in zip(runnable, data, strict=True):
                fixed = (0 if dev_auto else s.devices * c0) + (0 if dw_auto else k * dw)
                scaled = (s.devices * c0 if dev_auto else 0) + (k * dw if dw_auto else 0)
                fits.append(min(1.0, (budget - fixed) / scaled))
            possible = [f for f in fits if f >= AUTO_MIN_SHARE]
            share = min(possible) if possible else 1.0
        cpd = _round_down(c0 * share) if dev_auto else c0
        dw = _round_down(dw * share) if dw_auto else dw
        needs = [
            (DRIVER_CPUS + s.devices * cpd + k * dw, s.devices, k)
            for s, k in zip(runnable, data, strict=True)
        ]
        fitting = [n for n in needs if n[0] <= budget + DRIVER_CPUS + 1e-9]
        if nodes and fitting:
            need, d, k = max(fitting)
            why = (
                f"(the largest trial that fits, {d} device{'s' * (d > 1)} with {k} input "
                f"worker{'s' * (k > 1)}, needs {need:.2f} of {budget + DRIVER_CPUS:g} CPUs)"
            )
    chosen = {"cpus_per_device": cpd, "cpus_per_data_worker": dw}
    resolved = r.model_copy(update=chosen)
    auto = [f"{k} {v:g}" for k, v in chosen.items() if getattr(r, k) is None]
    note = f"resources auto: {', '.join(auto)} {why}".rstrip()
    return spec.model_copy(update={"resources": resolved}), note


def _round_down(value: float) -> float:
    """Whole CPUs from 1 up (torch threads are whole), else hundredths of one."""
    if value >= 1:
        return float(math.floor(value + 1e-9))
    return max(math.floor(value * 100 + 1e-9) / 100, 0.01)


def resource_problem(res: ResourcePlan, nodes: list[Node]) -> str | None:
    """Why this trial could never be scheduled on these nodes, or None if it can."""
    if not nodes:
        return None
    cpus = sum(n.cpus for n in nodes)
    gpus = sum(n.gpus for n in nodes)
    if res.total_gpus > gpus:
        return (
            f"needs {res.total_gpus:g} GPUs ({res.workers} x {res.gpus_per_worker:g}), the "
            f"cluster has {gpus:g}; lower grid.devices or add GPU nodes"
        )
    if res.total_cpus > cpus + 1e-9:
        fit = (cpus - res.driver_cpus - res.data_cpus) / res.workers
        hint = (
            f"set resources.cpus_per_device <= {math.floor(fit * 100) / 100:g}"
            if fit > 0
            else "lower data_workers or resources.cpus_per_data_worker"
        )
        return (
            f"needs {res.describe()}, the cluster has {cpus:g} CPUs; the input pipeline must "
            f"keep {res.data_cpus:g} CPU beside the train workers (Ray Data without it: the "
            "input pipeline hangs); "
            f"{hint}"
        )
    # Each worker is one placement-group bundle and must fit on a single node.
    free = sorted(([n.cpus, n.gpus] for n in nodes), key=lambda f: -f[0])
    for _ in range(res.workers):
        for f in free:
            if f[0] + 1e-9 >= res.cpus_per_worker and f[1] + 1e-9 >= res.gpus_per_worker:
                f[0] -= res.cpus_per_worker
                f[1] -= res.gpus_per_worker
                break
        else:
            return (
                f"no node combination holds {res.workers} workers of "
                f"{res.cpus_per_worker:g} CPU + {res.gpus_per_worker:g} GPU each"
            )
    return None
