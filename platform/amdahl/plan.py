"""From a validated spec to what will run: trials, their resources, and the launches that run them.

Expansion is a cartesian product minus exclusions; each trial gets a stable id (a hash of its
settings, not of its position) so resume and MLflow can recognise it. Every trial that cannot run
gets a reason *here*, before anything launches: a value this build lacks, a value the device cannot
do, or resources the cluster does not have (including the two hang cases of
docs/architecture.md: Ray Data left with no CPU beside the train workers, and the Tune trial's
own default CPU).

A plan as a whole is refused for one thing only: spanning several nodes while Ray's storage is
the sweep directory on one node's disk (`check_storage`).

Pure: imports neither ray nor torch. The cluster is described by `Node`s that run/ passes in.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from amdahl.errors import UserError
from amdahl.spec import AXES, GridSpec, SweepSpec

#: CPUs the Tune function trainable holds while it drives one launch. Ray rejects 0; a tiny
#: fraction keeps the trial from holding a whole CPU (docs/architecture.md, hang case b).
DRIVER_CPUS = 0.01

#: grid.prefetch_batches' default; trial labels name other values.
DEFAULT_PREFETCH = GridSpec.model_fields["prefetch_batches"].default[0]

#: Axis values this build runs. Values in the schema but not here are refused as "not supported
#: yet" rather than silently ignored.
SUPPORTED: dict[str, frozenset[str]] = {
    "precision": frozenset({"fp32", "tf32", "bf16", "fp16", "bf16_weights"}),
    "compile": frozenset({"eager", "inductor", "torchscript"}),
    "sync": frozenset(
        {
            "ddp",
            "ddp_fp16",
            "ddp_bf16",
            "powersgd",
            "accumulate",
            "local_sgd",
            "zero1",
            "fsdp",
            "param_server",
            "none",
        }
    ),
}

#: Values that need a CUDA device (and, for ddp_bf16, NCCL): refused on CPU with this reason.
NEEDS_CUDA: dict[tuple[str, str], str] = {
    ("precision", "tf32"): "tf32 is a CUDA tensor-core math mode; set resources.use_gpu: true",
    ("sync", "ddp_bf16"): "bf16_compress_hook needs CUDA and NCCL (it raises TypeError on gloo); "
    "use ddp_fp16 on CPU",
}

#: Combinations of axis values that cannot run together, with the reason (seen on an H100:
#: FSDP2's `fully_shard` registers forward pre-hooks, which TorchScript modules refuse).
INCOMPATIBLE: dict[tuple[tuple[str, str], tuple[str, str]], str] = {
    (("compile", "torchscript"), ("sync", "fsdp")): "FSDP2 shards a module through forward "
    "hooks, which TorchScript modules do not support; use compile eager or inductor with fsdp",
}


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


@dataclass(frozen=True)
class Trial:
    """One point of the grid."""

    trial_id: str
    settings: dict[str, Any]  # the axes plus "params" (the workload's full parameters)
    resources: ResourcePlan
    refused: str | None = None  # why it will not run, or None

    def launch_key(self, across_devices: bool = False) -> str:
        """Trials with equal keys share one worker group (same worker shape, same dataset);
        `across_devices` leaves the device count out (see SweepPlan.shares_across_devices)."""
        s = self.settings
        r = self.resources
        key = [r.cpus_per_worker, r.gpus_per_worker, s["data_workers"], s["input"]]
        if not across_devices:
            key.insert(0, s["devices"])
        return _hash([*key, s["params"]])

    def label(self) -> str:
        s = self.settings
        extra = "".join(f" {k}={v}" for k, v in s["axis_params"].items())
        if s["input"] != "ray_data":
            extra = f" {s['input']}{extra}"
        if s["prefetch_batches"] != DEFAULT_PREFETCH:
            extra = f" p{s['prefetch_batches']}{extra}"
        return (
            f"d{s['devices']} b{s['batch_size']} {s['precision']} {s['compile']} "
            f"w{s['data_workers']} {s['sync']}{extra}"
        )


@dataclass(frozen=True)
class Launch:
    """One Ray Train worker group running several trials one after another, fewest devices
    first. It holds the workers of its largest trial; a trial on fewer devices runs on the
    first ranks (see worlds.py)."""

    launch_id: str
    trials: tuple[Trial, ...]

    @property
    def resources(self) -> ResourcePlan:
        return max((t.resources for t in self.trials), key=lambda r: r.workers)

    @property
    def device_counts(self) -> list[int]:
        return sorted({t.settings["devices"] for t in self.trials})


@dataclass
class SweepPlan:
    spec: SweepSpec
    trials: list[Trial]
    nodes: list[Node] = field(default_factory=list)
    #: the workload preprocesses its rows in the input pipeline (Ray Train's streaming split)
    preprocesses: bool = False
    #: what `resources: auto` chose and why (plan.auto_resources), None when nothing was auto
    resource_note: str | None = None

    @property
    def runnable(self) -> list[Trial]:
        return [t for t in self.trials if t.refused is None]

    @property
    def refused(self) -> list[Trial]:
        return [t for t in self.trials if t.refused is not None]

    def launches(
        self,
        skip: set[str] | frozenset[str] = frozenset(),
        group: bool = True,
        across_devices: bool = True,
    ) -> list[Launch]:
        """Runnable trials not in `skip`, grouped by worker-group shape (and across device
        counts where `shares_across_devices`), launches and their trials fewest devices first.

        `group=False` gives every trial a worker group of its own (the raw Tune+Train pattern),
        `across_devices=False` one per device count; both are kept for comparisons in
        benchmarks/sweep_overhead.py.
        """
        across = across_devices and self.shares_across_devices
        groups: dict[str, list[Trial]] = {}
        for t in self.runnable:
            if t.trial_id not in skip:
                groups.setdefault(t.launch_key(across) if group else t.trial_id, []).append(t)
        devices = lambda t: t.settings["devices"]  # noqa: E731
        launches = [Launch(key, tuple(sorted(ts, key=devices))) for key, ts in groups.items()]
        return sorted(launches, key=lambda launch: devices(launch.trials[0]))

    @property
    def shares_across_devices(self) -> bool:
        """Whether trials of different device counts may share one worker group (sized to the
        largest). Starting a worker group costs seconds of new processes; sharing one is only
        honest where a trial on the first d ranks runs as a d-worker group would: on a single
        node (across nodes a subset's placement differs), one launch at a time (exclusive
        isolation: the idle ranks' resources are taken from no one), and with per-rank shards
        (not Ray Train's streaming split of a preprocessing workload, fixed to the group size).
        """
        return self.spec.isolation == "exclusive" and len(self.nodes) == 1 and not self.preprocesses


def plan_sweep(
    spec: SweepSpec,
    nodes: list[Node],
    workload_defaults: dict[str, Any],
    preprocesses: bool = False,
) -> SweepPlan:
    """Expand the grid, give every trial its resources and, where it cannot run, the reason.

    `resources` fields left to auto are chosen first (`auto_resources`); the plan's `spec` holds
    the numbers chosen, which is what runs and what trial ids hash.
    """
    grid = expand_grid(spec, workload_defaults)
    spec, note = auto_resources(spec, grid, nodes)
    trials = [_make_trial(spec, settings, nodes) for settings in grid]
    return SweepPlan(
        spec=spec, trials=trials, nodes=nodes, preprocesses=preprocesses, resource_note=note
    )


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
    spec: SweepSpec, grid: list[dict[str, Any]], nodes: list[Node]
) -> tuple[SweepSpec, str | None]:
    """`spec` with `cpus_per_device` and `cpus_per_data_worker` chosen where left to auto, and
    a line saying what was chosen and why (None when both were set).

    CPU trials: the largest trial that can run at all (its train workers, its input workers
    and DRIVER_CPUS for the Tune trial) must fit the cluster's CPUs, so neither hang case
    (Ray Data left no CPU, the trial's own CPU) can arise from a default; both values shrink
    in proportion from AUTO_CPUS_PER_DEVICE / AUTO_CPUS_PER_DATA_WORKER, rounded down to
    0.01, no lower than AUTO_MIN_SHARE of them. GPU trials: each worker gets its GPU node's
    CPUs, less AUTO_GPU_NODE_RESERVE (or the largest trial's input CPUs, if more), divided by
    the workers the node holds; the smallest GPU node type decides. A value the user set is
    kept as set, and `_resource_problem` still refuses what does not fit.
    """
    r = spec.resources
    if r.cpus_per_device is not None and r.cpus_per_data_worker is not None:
        return spec, None
    runnable = [s for s in grid if _capability_problem(spec, s) is None] or grid
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
        c0 = AUTO_CPUS_PER_DEVICE if dev_auto else r.cpus_per_device
        budget = sum(n.cpus for n in nodes) - DRIVER_CPUS
        share = 1.0
        if nodes:
            fits = []
            for s, k in zip(runnable, data, strict=True):
                fixed = (0 if dev_auto else s["devices"] * c0) + (0 if dw_auto else k * dw)
                scaled = (s["devices"] * c0 if dev_auto else 0) + (k * dw if dw_auto else 0)
                fits.append(min(1.0, (budget - fixed) / scaled))
            possible = [f for f in fits if f >= AUTO_MIN_SHARE]
            share = min(possible) if possible else 1.0
        cpd = _round_down(c0 * share) if dev_auto else c0
        dw = _round_down(dw * share) if dw_auto else dw
        needs = [
            (DRIVER_CPUS + s["devices"] * cpd + k * dw, s["devices"], k)
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


def expand_grid(spec: SweepSpec, workload_defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Cartesian product of all axes, in file order, minus entries matching an `exclude`."""
    axes: dict[str, list[Any]] = {a: list(getattr(spec.grid, a)) for a in AXES}
    param_axes = spec.grid.param_axes()
    names = [*axes, *(f"params.{k}" for k in param_axes)]
    values = [*axes.values(), *param_axes.values()]
    out = []
    for combo in itertools.product(*values):
        point = dict(zip(names, combo, strict=True))
        if any(all(point.get(k) == v for k, v in ex.items()) for ex in spec.exclude):
            continue
        axis_params = {k.removeprefix("params."): v for k, v in point.items() if "." in k}
        settings = {a: point[a] for a in AXES}
        settings["axis_params"] = axis_params
        settings["params"] = {**workload_defaults, **spec.params, **axis_params}
        settings["options"] = _relevant_options(spec, settings)
        out.append(settings)
    return out


#: Which `options` fields each axis value reads; only those enter a trial's settings and id.
_OPTIONS_USED_BY: dict[str, tuple[str, ...]] = {
    "inductor": ("compile_mode",),
    "ddp": ("bucket_cap_mb",),
    "ddp_fp16": ("bucket_cap_mb",),
    "ddp_bf16": ("bucket_cap_mb",),
    "powersgd": ("bucket_cap_mb", "powersgd_rank"),
    "accumulate": ("bucket_cap_mb", "accumulate_steps"),
    "local_sgd": ("local_sgd_every",),
    "param_server": ("ps_shards",),
}


#: Options added after sweeps were run with their default behaviour: they enter a trial's
#: settings (and so its id) only when set to something else, so earlier sweeps keep their ids.
_OPTIONS_ONLY_WHEN_SET = {"compile_cache": "cold"}


def _relevant_options(spec: SweepSpec, settings: dict[str, Any]) -> dict[str, Any]:
    names: list[str] = []
    for value in (settings["compile"], settings["sync"]):
        names.extend(_OPTIONS_USED_BY.get(value, ()))
    options = {n: getattr(spec.options, n) for n in names}
    if settings["compile"] == "inductor":
        options.update(
            {
                n: getattr(spec.options, n)
                for n, default in _OPTIONS_ONLY_WHEN_SET.items()
                if getattr(spec.options, n) != default
            }
        )
    return options


def trial_id(spec: SweepSpec, settings: dict[str, Any]) -> str:
    """Stable id: everything that changes what is measured, nothing about order or repeats."""
    t = spec.train
    identity: dict[str, Any] = {
        "workload": spec.workload,
        "settings": {k: v for k, v in settings.items() if k != "axis_params"},
        "train": [t.steps, t.warmup_steps, t.seed, t.lr, t.scaling, t.optimizer],
        "resources": spec.resources.model_dump(),
    }
    # Later train fields enter the id only when set, so earlier sweeps keep their ids.
    schedule = {
        "lr_scaling": t.lr_scaling,
        "lr_base_batch": t.lr_base_batch if t.lr_scaling != "none" else None,
        "lr_warmup_steps": t.lr_warmup_steps,
        "target": t.target.model_dump() if t.target else None,
    }
    if schedule != {
        "lr_scaling": "none",
        "lr_base_batch": None,
        "lr_warmup_steps": 0,
        "target": None,
    }:
        identity["schedule"] = schedule
    return _hash(identity)


def _make_trial(spec: SweepSpec, settings: dict[str, Any], nodes: list[Node]) -> Trial:
    r = spec.resources
    resources = ResourcePlan(
        driver_cpus=DRIVER_CPUS,
        workers=settings["devices"],
        cpus_per_worker=r.cpus_per_device,
        gpus_per_worker=r.gpus_per_device if r.use_gpu else 0.0,
        data_cpus=_data_workers_in_total(settings) * r.cpus_per_data_worker,
    )
    tid = trial_id(spec, settings)
    reason = _capability_problem(spec, settings) or _resource_problem(resources, nodes)
    return Trial(trial_id=tid, settings=settings, resources=resources, refused=reason)


def _data_workers_in_total(settings: dict[str, Any]) -> int:
    """ray_data: one preprocessing operator of `data_workers` tasks for all devices;
    torch_loader: a DataLoader with `data_workers` processes on every device."""
    if settings["input"] == "torch_loader":
        return settings["devices"] * settings["data_workers"]
    return settings["data_workers"]


def _capability_problem(spec: SweepSpec, settings: dict[str, Any]) -> str | None:
    gpus = spec.resources.gpus_per_device
    if spec.resources.use_gpu and gpus > 1:
        return (
            f"resources.gpus_per_device={gpus:g}: each train worker drives one GPU, so the "
            "others would sit idle; set it to 1 and raise grid.devices"
        )
    if spec.resources.use_gpu and gpus < 1 and settings["devices"] > 1:
        return (
            f"resources.gpus_per_device={gpus:g} with {settings['devices']} devices: Ray may put "
            "two workers on one GPU, which NCCL rejects (duplicate GPU); use 1"
        )
    for axis, supported in SUPPORTED.items():
        value = settings[axis]
        if not spec.resources.use_gpu and (axis, value) in NEEDS_CUDA:
            return f"{axis}={value}: {NEEDS_CUDA[(axis, value)]}"
        if value not in supported:
            return (
                f"{axis}={value}: not supported yet in this build "
                f"(supported: {', '.join(sorted(supported))})"
            )
    for (a, b), reason in INCOMPATIBLE.items():
        if settings[a[0]] == a[1] and settings[b[0]] == b[1]:
            return f"{a[0]}={a[1]} with {b[0]}={b[1]}: {reason}"
    return None


def _resource_problem(res: ResourcePlan, nodes: list[Node]) -> str | None:
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


def launch_hosts(plan: SweepPlan) -> list[Node]:
    """The nodes that could run part of one of the plan's launches: its Tune trainable, which
    holds DRIVER_CPUS and starts the launch's Ray Train controller on its own node, or one of
    its train workers (any worker needs CPUs too). A node without CPUs (cluster.yaml's head,
    which runs only the sweep driver) hosts neither."""
    return [n for n in plan.nodes if n.cpus + 1e-9 >= DRIVER_CPUS] if plan.runnable else []


def check_storage(plan: SweepPlan) -> None:
    """Refuse a plan that spans several nodes while Ray's storage is the sweep directory.

    The rule: more than one node could run part of a launch (`launch_hosts`). Ray Train makes
    a launch's storage directory on its controller's node, and rank 0 writes its checkpoint of
    finished trials (read back after a `train.max_failures` restart) from its own node; on a
    node-local path each node sees only its own files. Whether one launch's workers fit on one
    node does not matter: the controller may sit on another, and a restart may place rank 0
    anywhere. The nodes are the cluster's as planned (alive, or all the autoscaler may start),
    so a cluster that may grow to several such nodes is refused before it has grown.

    `storage` set is the user's statement that it is shared (a URI, or a filesystem mounted on
    every node); it is not probed here.
    """
    hosts = launch_hosts(plan)
    if plan.spec.storage is not None or len(hosts) <= 1:
        return
    names = ", ".join(n.name for n in hosts[:4]) + (", ..." if len(hosts) > 4 else "")
    raise UserError(
        f"storage: not set, so Ray keeps this sweep's run state in the sweep directory on "
        f"the driver's disk, but the plan spans {len(hosts)} nodes that can run its launches "
        f"({names}): rank 0 writes its checkpoint of finished trials from whichever node it "
        "runs on, and a restart reads it back from another, so every node must reach the "
        "same storage; set `storage: s3://bucket/amdahl` (or gs://...), or the absolute path "
        "of a filesystem every node mounts (NFS, EFS), e.g. --set storage=s3://bucket/amdahl"
    )


def _hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:10]
