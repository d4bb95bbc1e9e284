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

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import BaseModel

from amdahl.columns import AXES
from amdahl.errors import UserError
from amdahl.spec.schema import GridSpec, SweepSpec
from amdahl.strategies import STRATEGIES

#: CPUs the Tune function trainable holds while it drives one launch. Ray rejects 0; a tiny
#: fraction keeps the trial from holding a whole CPU (docs/architecture.md, hang case b).
DRIVER_CPUS = 0.01

#: grid.prefetch_batches' default; trial labels name other values.
DEFAULT_PREFETCH = GridSpec.model_fields["prefetch_batches"].default[0]

#: Values that need a CUDA device (and, for ddp_bf16, NCCL): refused on CPU with this reason. The
#: sync strategies' come from their table (strategies.py).
NEEDS_CUDA: dict[tuple[str, str], str] = {
    ("precision", "tf32"): "tf32 is a CUDA tensor-core math mode; set resources.use_gpu: true",
    **{("sync", n): s.needs_cuda for n, s in STRATEGIES.items() if s.needs_cuda},
}

#: Combinations of axis values that cannot run together, with the reason; the sync strategies'
#: come from their table (seen on an H100: FSDP2's `fully_shard` registers forward pre-hooks,
#: which TorchScript modules refuse).
INCOMPATIBLE: dict[tuple[tuple[str, str], tuple[str, str]], str] = {
    ((axis, value), ("sync", n)): reason
    for n, s in STRATEGIES.items()
    for axis, value, reason in s.incompatible
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
    #: Hash of what decides its input batches (Workload.input_key): trials with equal keys can
    #: share a launch's input pipeline. Default: all its parameters.
    input_key: str = ""

    def launch_key(self, across_devices: bool = False, streamed: bool = False) -> str:
        """Trials with equal keys share one worker group (same worker shape, same input);
        `across_devices` leaves the device count out (see SweepPlan.shares_across_devices);
        `streamed`: a preprocessing workload's launch streams one Ray Data pipeline, whose
        prefetch is then the launch's."""
        s = self.settings
        r = self.resources
        key = [r.cpus_per_worker, r.gpus_per_worker, s["data_workers"], s["input"]]
        if streamed and s["input"] == "ray_data":
            key.append(s["prefetch_batches"])  # one pipeline per launch (data.LaunchStream)
        if not across_devices:
            key.insert(0, s["devices"])
        return _hash([*key, self.input_key or s["params"]])

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
                key = t.launch_key(across, self.preprocesses) if group else t.trial_id
                groups.setdefault(key, []).append(t)
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
    input_key: Callable[[dict[str, Any]], Any] | None = None,
) -> SweepPlan:
    """Expand the grid, give every trial its resources and, where it cannot run, the reason.

    `resources` fields left to auto are chosen first (`auto_resources`); the plan's `spec` holds
    the numbers chosen, which is what runs and what trial ids hash. `input_key(params)` says
    what decides a trial's input (Workload.input_key; default: all its parameters).
    """
    grid = expand_grid(spec, workload_defaults)
    spec, note = auto_resources(spec, grid, nodes)
    trials = [_make_trial(spec, settings, nodes) for settings in grid]
    if input_key is not None:
        trials = [
            dataclasses.replace(t, input_key=_hash(input_key(t.settings["params"]))) for t in trials
        ]
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
#: The sync strategies' come from their table (strategies.py).
_OPTIONS_USED_BY: dict[str, tuple[str, ...]] = {
    "inductor": ("compile_mode", "compile_cache"),
    **{n: s.options for n, s in STRATEGIES.items()},
}

# --------------------------------------------------------------------------- trial identity
#
# A trial id hashes what changes what is measured. Sweep directories keep the ids they were
# recorded under and resume finds finished trials by id, so a field added to the schema must
# not change the id of a trial that leaves it at its default (docs/architecture.md, "How to
# add ...", "An axis"). The rule: the keys of identity schema 1 below (everything hashed when
# the rule was written) are always hashed, exactly as they were; any other key of the same
# section (a new axis, option, resources or train field) enters the identity only when its value
# differs from its default in the spec's schema. NEVER edit the schema-1 sets: a key added to
# one changes the id of every trial.

#: Schema 1: the keys of a trial's settings always hashed (the axes, the workload's
#: parameters, its options). `axis_params` never is (its values are in `params`).
ID_SCHEMA_1_SETTINGS = frozenset(
    {
        "devices",
        "batch_size",
        "precision",
        "compile",
        "data_workers",
        "input",
        "prefetch_batches",
        "sync",
        "params",
        "options",
    }
)
#: Schema 1: (axis value, option) pairs: the options always in the settings of a trial with
#: that axis value. (zero1 reads bucket_cap_mb too, but did not pass it on before; it enters
#: zero1's settings only when set to other than its default, as the rule says.)
ID_SCHEMA_1_OPTIONS = frozenset(
    {
        ("inductor", "compile_mode"),
        *(
            (sync, "bucket_cap_mb")
            for sync in ("ddp", "ddp_fp16", "ddp_bf16", "powersgd", "accumulate")
        ),
        ("powersgd", "powersgd_rank"),
        ("accumulate", "accumulate_steps"),
        ("local_sgd", "local_sgd_every"),
        ("param_server", "ps_shards"),
    }
)
#: Schema 1: the `resources` fields always hashed (after `resources: auto` is resolved).
ID_SCHEMA_1_RESOURCES = frozenset(
    {"use_gpu", "cpus_per_device", "gpus_per_device", "placement", "cpus_per_data_worker"}
)
#: Schema 1: the `train` fields always hashed, as a list in this order.
ID_SCHEMA_1_TRAIN = ("steps", "warmup_steps", "seed", "lr", "scaling", "optimizer")
#: Schema 1: the `train` fields hashed as one block ("schedule") when any differs from its
#: default (an earlier hand-written form of the rule, kept as it was so its ids stay).
ID_SCHEMA_1_SCHEDULE = ("lr_scaling", "lr_base_batch", "lr_warmup_steps", "target")
#: Schema 1: the `train.target` fields always hashed when a target is set.
ID_SCHEMA_1_TARGET = frozenset({"metric", "value", "max_steps", "eval_every"})
#: `train` fields that never enter the id: they do not change what is measured.
TRAIN_NOT_IN_ID = frozenset({"repeats", "max_failures"})

_NO_DEFAULT = object()


def _default(model: type[BaseModel], name: str) -> Any:
    """A schema field's default as it is hashed (a model's default dumped), or _NO_DEFAULT."""
    info = model.model_fields.get(name)
    if info is None or info.is_required():
        return _NO_DEFAULT
    value = info.get_default(call_default_factory=True)
    return value.model_dump() if isinstance(value, BaseModel) else value


def _axis_default(grid: type[BaseModel], name: str) -> Any:
    """An axis's default value: the single value of its default list, or _NO_DEFAULT."""
    value = _default(grid, name)
    return value[0] if isinstance(value, list) and len(value) == 1 else _NO_DEFAULT


def _identity_fields(
    values: dict[str, Any], schema_1: frozenset[str], default: Callable[[str], Any]
) -> dict[str, Any]:
    """`values` less the keys outside `schema_1` that hold their default."""
    return {k: v for k, v in values.items() if k in schema_1 or v != default(k)}


def _section_identity(section: BaseModel, schema_1: frozenset[str]) -> dict[str, Any]:
    """A spec section's fields as hashed: schema 1's, and the others where not at their
    default (the section's own class holds the defaults)."""
    return _identity_fields(section.model_dump(), schema_1, partial(_default, type(section)))


def _relevant_options(spec: SweepSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """The options this trial's axis values read: schema 1's, then later ones where set to
    something other than their default (compile_cache: cold is left out, as before the rule)."""
    read = [
        (v, n) for v in (settings["compile"], settings["sync"]) for n in _OPTIONS_USED_BY.get(v, ())
    ]
    default = partial(_default, type(spec.options))
    values = {n: getattr(spec.options, n) for _, n in read}
    # Schema 1's first, in the order they are read, so the settings stay as they were.
    first = [n for v, n in read if (v, n) in ID_SCHEMA_1_OPTIONS]
    later = [n for v, n in read if (v, n) not in ID_SCHEMA_1_OPTIONS and values[n] != default(n)]
    return {n: values[n] for n in (*first, *later)}


def trial_id(spec: SweepSpec, settings: dict[str, Any]) -> str:
    """Stable id: everything that changes what is measured, nothing about order or repeats;
    a field added to the schema enters it only when set to other than its default (above)."""
    t = spec.train
    grid = type(spec.grid)
    hashed = {k: v for k, v in settings.items() if k != "axis_params"}
    for k in hashed.keys() - ID_SCHEMA_1_SETTINGS:
        if _axis_default(grid, k) is _NO_DEFAULT:
            raise ValueError(
                f"setting {k!r} is not in trial-id schema 1 and has no one-value default in "
                "spec.GridSpec: it would change every trial id (docs/architecture.md, "
                '"How to add ...", "An axis")'
            )
    identity: dict[str, Any] = {
        "workload": spec.workload,
        "settings": _identity_fields(hashed, ID_SCHEMA_1_SETTINGS, partial(_axis_default, grid)),
        "train": [getattr(t, name) for name in ID_SCHEMA_1_TRAIN],
        "resources": _section_identity(spec.resources, ID_SCHEMA_1_RESOURCES),
    }
    schedule = {
        "lr_scaling": t.lr_scaling,
        "lr_base_batch": t.lr_base_batch if t.lr_scaling != "none" else None,
        "lr_warmup_steps": t.lr_warmup_steps,
        "target": _section_identity(t.target, ID_SCHEMA_1_TARGET) if t.target else None,
    }
    if schedule != {
        "lr_scaling": "none",
        "lr_base_batch": None,
        "lr_warmup_steps": 0,
        "target": None,
    }:
        identity["schedule"] = schedule
    known = frozenset({*ID_SCHEMA_1_TRAIN, *ID_SCHEMA_1_SCHEDULE, *TRAIN_NOT_IN_ID})
    later = {k: v for k, v in _section_identity(t, known).items() if k not in known}
    if later:
        identity["train_later"] = later
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
    for (axis, value), reason in NEEDS_CUDA.items():
        if not spec.resources.use_gpu and settings[axis] == value:
            return f"{axis}={value}: {reason}"
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
