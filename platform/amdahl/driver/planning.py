"""The plan a sweep runs: the user's code and data checked first, then planned for the nodes.

- `check_workloads`: every parameter set's workload built (unknown parameters refused), its
  `params.data` found (data.storage.check_source) and its data path run on a few rows
  (workload.data_checks.check_workload): all before anything is drawn or launched;
- `check_sweep`: the search section checked (search.spec_checks.check_search), the workload
  imported from the user's folder (workload.locate_spec_workload), then `check_workloads`;
- `plan_for`: `check_sweep`, then the plan (plan.launches.plan_sweep) for the nodes the sweep
  would run on (driver.cluster.cluster_nodes, by the rule `platform sweep` follows). The sweep
  driver itself plans for the nodes of the Ray it has started or joined (driver.sweep).

This lives in the driver, not in plan/ (pure: spec in, trials out), because its checks need the
data and search layers, which plan/ may not import (docs/architecture.md). Nothing here imports
Ray Tune or Train, and Ray itself only through driver.cluster's functions, so `platform plan`
stays quick (tests/unit/cli/test_cli.py checks it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from amdahl.analysis.memory_model import MemoryFacts
from amdahl.driver.cluster import cluster_nodes
from amdahl.plan.fits import FactsSource
from amdahl.plan.launches import SweepPlan, WorkloadFacts, plan_sweep
from amdahl.search.spec_checks import check_search
from amdahl.spec.schema import SweepSpec
from amdahl.workload.code import WorkloadCode, locate_spec_workload, make_workload
from amdahl.workload.data_checks import check_workload


def check_workloads(spec: SweepSpec) -> None:
    """The spec's workload and every parameter set of its grid: built, their data found and run
    on a few rows, refusing (UserError) what would fail in a trial."""
    from amdahl.data.storage import check_source  # numpy and pyarrow: only when planning

    workload = make_workload(spec.workload, spec.params)
    for name, values in spec.grid.param_axes().items():
        for v in values:
            variant = make_workload(spec.workload, {**spec.params, name: v})
            check_source(variant)
            check_workload(variant, spec.train.seed)
    check_source(workload)
    check_workload(workload, spec.train.seed)


def check_sweep(spec: SweepSpec) -> WorkloadCode:
    """Everything checked before a sweep is planned, refusing (UserError) what would fail: the
    search section, the workload imported from the user's folder where it lives there
    (workload_path, the sweep file's directory, the working directory: workload.locate_workload)
    with every abstract method implemented, and its data path on a few rows of every parameter
    set (`check_workloads`). Returns the workload's code (what Ray's workers import)."""
    check_search(spec)
    code = locate_spec_workload(spec)
    check_workloads(spec)
    return code


def plan_for(spec: SweepSpec, address: str | None = None) -> SweepPlan:
    """`spec`, checked (`check_sweep`), planned for the machines `run_sweep(spec,
    address=address)` would run it on: the Ray cluster at `address`, else the one running here
    (as `ray.init()` finds it), both joined and never started, else this machine with no Ray
    started at all; `address="local"` is this machine even where a cluster runs
    (driver.cluster.cluster_address decides for both)."""
    check_sweep(spec)
    return plan_sweep(spec, cluster_nodes(address), workload_facts(spec))


def workload_facts(spec: SweepSpec) -> WorkloadFacts:
    """What the plan asks of the spec's workload (plan.launches.WorkloadFacts.of), with the
    memory probe's facts for its memory predictions (worker.memory_probe: measured on this
    process's CPU once per parameters, precision and optimizer, then read from its cache)."""
    return dataclasses.replace(WorkloadFacts.of(spec), memory=_memory_facts(spec))


_log = logging.getLogger(__name__)


def _memory_facts(spec: SweepSpec) -> FactsSource:
    from amdahl.worker.memory_probe import probe_memory

    known: dict[tuple[str, str], MemoryFacts | None] = {}

    def facts(params: dict[str, Any], precision: str) -> MemoryFacts | None:
        measured_as = "fp32" if precision == "tf32" else precision  # TF32 holds fp32 tensors
        key = (json.dumps(params, sort_keys=True, default=str), measured_as)
        if key not in known:
            workload = make_workload(spec.workload, params)
            try:
                found = probe_memory(workload, measured_as, spec.train.optimizer, spec.train.seed)
                known[key] = MemoryFacts.from_dict(found)
            except Exception as e:  # noqa: BLE001 - no prediction is a result, not a failure
                _log.warning("no memory prediction for %s %s: %s", spec.workload, precision, e)
                known[key] = None
        return known[key]

    return facts
