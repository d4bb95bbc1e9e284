"""The plan of a sweep: `plan_sweep` makes its trials for the nodes given, `SweepPlan` groups the
runnable ones into launches (one Ray Train worker group per shape serves every trial of it, one
after another).

Trials that share a worker-group shape and their input share a launch (`Trial.launch_key`), so a
sweep starts a worker group once per shape rather than once per trial. No plan needs shared
storage: a launch writes no Train checkpoint (the driver's work queue and results.parquet are
the record), so Ray's run state may stay on each node's own disk. Pure: no Ray, no torch; the
driver passes the cluster's `Node`s in (driver.planning.plan_for: the nodes `platform sweep`
would run on) and checks the user's code and data first, which needs layers this package may
not import. Planning builds workload objects (`WorkloadFacts.of`) but starts nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from amdahl.analysis.configs import group_configs
from amdahl.analysis.memory_model import MemoryFacts
from amdahl.columns import TrialSettings
from amdahl.plan.checks import alias_note, capability_problem
from amdahl.plan.fits import (
    FactsSource,
    device_memory_gb,
    largest_fitting_batch,
    memory_problem,
    predict_trial,
    resolve_max_batches,
)
from amdahl.plan.resources import (
    Node,
    ResourcePlan,
    auto_resources,
    resource_problem,
    trial_resources,
)
from amdahl.plan.trials import Trial, expand_grid, stable_hash, trial_id
from amdahl.spec.schema import SweepSpec
from amdahl.workload import preprocess_reads
from amdahl.workload.code import make_workload


@dataclass(frozen=True)
class Launch:
    """One Ray Train worker group running several trials one after another, fewest devices
    first. It holds the workers of its largest trial; a trial on fewer devices runs on the
    first ranks (worker/worlds.py)."""

    launch_id: str
    trials: tuple[Trial, ...]

    @property
    def resources(self) -> ResourcePlan:
        return max((t.resources for t in self.trials), key=lambda r: r.workers)

    @property
    def device_counts(self) -> list[int]:
        return sorted({t.settings.devices for t in self.trials})


@dataclass
class SweepPlan:
    """Every trial of a sweep, runnable or refused, on the nodes it was planned for."""

    spec: SweepSpec
    trials: list[Trial]
    nodes: list[Node] = field(default_factory=list)
    #: the workload preprocesses its rows in the input pipeline (Ray Train's streaming split)
    preprocesses: bool = False
    #: what `resources: auto` chose and why (resources.auto_resources), what `batch_size: max`
    #: resolved to, the duplicate trials `grid.options` dropped, and an older spelling's
    #: pointer (checks.alias_note); None: nothing to say
    resource_note: str | None = None
    #: The memory probe's facts the plan used, as (workload parameters, precision, facts):
    #: plan.json keeps them, so the report can say what another strategy would hold.
    memory_facts: list[tuple[dict[str, Any], str, MemoryFacts]] = field(default_factory=list)
    #: The device memory (GB) trials were held to (plan.fits.device_memory_gb); None: unknown.
    device_memory_gb: float | None = None

    @cached_property
    def labels(self) -> dict[str, str]:
        """Each trial's label by trial id, made as the report and the MLflow runs make a
        configuration's (analysis.configs: `d2 b256 fp32 eager w1 ddp`, then every axis some
        trial sets away from its default, defaults included, then the workload parameters that
        vary), so the plan, the live view, plan.json and the report name a trial alike."""
        rows = [t.identity(self.spec) for t in self.trials]
        return {r["trial_id"]: c.label for c in group_configs(rows) for r in c.rows}

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
        devices = lambda t: t.settings.devices  # noqa: E731
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


@dataclass(frozen=True)
class WorkloadFacts:
    """What planning asks of a sweep's workload: its parameters' defaults, whether it
    preprocesses its rows in the input pipeline, and what decides a parameter set's input
    batches (Workload.input_key; None: all its parameters)."""

    defaults: dict[str, Any]
    preprocesses: bool = False
    input_key: Callable[[dict[str, Any]], Any] | None = None
    #: Why the workload runs eager only (Workload.eager_only); None: every compile value.
    eager_only: str | None = None
    #: What a rank needs of its host (Workload.host_cpus_per_device); None: the default.
    host_cpus_per_device: float | None = None
    #: The memory probe's facts per (parameters, precision) (plan.fits; the driver gives it:
    #: measuring needs torch); None: no memory predictions.
    memory: FactsSource | None = None
    #: The device memory the workload states (Workload.device_memory_gb), GB; None: unstated.
    device_memory_gb: float | None = None
    #: Whether the workload names blocks to checkpoint (overrides Workload.blocks).
    names_blocks: bool = True

    @classmethod
    def of(cls, spec: SweepSpec) -> WorkloadFacts:
        """The spec's workload's own answers; it must be importable (workload.locate_workload)."""
        workload = make_workload(spec.workload, spec.params)
        return cls(
            workload.defaults,
            workload.preprocesses,
            lambda params: preprocess_reads.input_key(make_workload(spec.workload, params)),
            workload.eager_only,
            workload.host_cpus_per_device,
            device_memory_gb=workload.device_memory_gb(),
            names_blocks=workload.names_blocks(),
        )


def plan_sweep(
    spec: SweepSpec, nodes: list[Node], workload: WorkloadFacts | None = None
) -> SweepPlan:
    """`spec` planned for `nodes`: the grid expanded, every trial given its resources and, where
    it cannot run, the reason.

    `resources` fields left to auto are chosen first (`auto_resources`); the plan's `spec` holds
    the numbers chosen, which is what runs and what trial ids hash. `workload`: what the plan
    asks of the workload (default: the spec's own, `WorkloadFacts.of`; tests give theirs to
    plan without one).
    """
    facts = workload if workload is not None else WorkloadFacts.of(spec)
    used: list[tuple[dict[str, Any], str, MemoryFacts]] = []
    facts = dataclasses.replace(facts, memory=_recording(facts.memory, used))
    duplicates: list[str] = []
    grid, batch_note = resolve_max_batches(
        spec, expand_grid(spec, facts.defaults, duplicates), facts.memory, facts.device_memory_gb
    )
    spec, note = auto_resources(spec, grid, nodes, facts.host_cpus_per_device)
    note = "\n".join(n for n in (note, batch_note, *duplicates, alias_note(spec)) if n) or None
    trials = [_make_trial(spec, settings, nodes, facts) for settings in grid]
    if facts.input_key is not None:
        key = facts.input_key
        trials = [
            dataclasses.replace(t, input_key=stable_hash(key(t.settings.params))) for t in trials
        ]
    return SweepPlan(
        spec=spec,
        trials=trials,
        nodes=nodes,
        preprocesses=facts.preprocesses,
        resource_note=note,
        memory_facts=used,
        device_memory_gb=device_memory_gb(spec, facts.device_memory_gb),
    )


def _recording(
    source: FactsSource | None, used: list[tuple[dict[str, Any], str, MemoryFacts]]
) -> FactsSource | None:
    """`source`, noting each distinct answer it gives in `used`."""
    if source is None:
        return None

    def facts(params: dict[str, Any], precision: str) -> MemoryFacts | None:
        found = source(params, precision)
        if found is not None and not any(p == params and q == precision for p, q, _ in used):
            used.append((params, precision, found))
        return found

    return facts


def _make_trial(
    spec: SweepSpec, settings: TrialSettings, nodes: list[Node], facts: WorkloadFacts
) -> Trial:
    resources = trial_resources(spec, settings)
    memory = predict_trial(spec, settings, facts.memory)
    reason = capability_problem(spec, settings) or resource_problem(resources, nodes)
    if facts.eager_only and settings.compile != "eager":
        reason = f"compile={settings.compile}: {facts.eager_only}"
    mode = settings.activation_checkpointing
    if not facts.names_blocks and mode != "none":
        reason = reason or (
            f"activation_checkpointing={mode}: the workload names no blocks to checkpoint; "
            "define blocks(model) returning them (e.g. a transformer's layers: docs/workload.md, "
            '"The Workload API")'
        )
    reason = reason or memory_problem(spec, settings, memory, facts.memory, facts.device_memory_gb)
    return Trial(
        trial_id=trial_id(spec, settings),
        settings=settings,
        resources=resources,
        refused=reason,
        predicted_peak_mem_bytes=memory.total if memory else None,
        largest_batch_fits=largest_fitting_batch(
            spec, settings, facts.memory, facts.device_memory_gb
        ),
    )
