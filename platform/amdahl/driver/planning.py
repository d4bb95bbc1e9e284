"""The plan a sweep runs: the user's code and data checked first, then planned for the nodes.

- `check_workloads`: every parameter set's workload built (unknown parameters refused), its
  `params.data` found (data.storage.check_source) and its data path run on a few rows
  (workload.check_workload): all before anything is drawn or launched;
- `make_plan`: the search section checked (search.spec_checks.check_search), the workload imported
  from the user's folder (workload.locate_spec_workload), `check_workloads`, then the plan for the
  nodes (plan.make.plan_for_nodes); `plan_for` does the same for `platform plan`.

This lives in the driver, not in plan/ (pure: spec in, trials out), because its checks need the
data and search layers, which plan/ may not import (docs/architecture.md). Nothing here imports
Ray Tune or Train, and Ray itself only through driver.cluster's functions, so `platform plan`
stays quick (tests/unit/test_cli.py checks it).
"""

from __future__ import annotations

from amdahl.driver.cluster import connect_ray, local_nodes, ray_nodes
from amdahl.plan.launches import SweepPlan
from amdahl.plan.make import plan_for_nodes
from amdahl.plan.resources import Node
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


def make_plan(
    spec: SweepSpec, nodes: list[Node] | None = None, code: WorkloadCode | None = None
) -> SweepPlan:
    """Validate the workload and its parameters, then plan against `nodes` (default: this
    host).

    The workload is imported from the user's folder where it lives there (workload_path, the
    sweep file's directory, the working directory: workload.locate_workload), must implement
    every abstract method, and its data path runs on a few rows of every parameter set
    (`check_workloads`). `code`: the workload already located, by a caller that has checked the
    search section too (run_sweep does both before it opens a directory or starts Ray), so
    neither runs twice.
    """
    if code is None:
        check_search(spec)
        locate_spec_workload(spec)
    check_workloads(spec)
    return plan_for_nodes(spec, nodes if nodes is not None else local_nodes())


def plan_for(spec: SweepSpec, address: str | None = None) -> SweepPlan:
    """`spec` planned for the Ray cluster at `address` (joined, not started: its nodes as
    `ray_nodes` counts them), else for this machine (no Ray started at all)."""
    if not address:
        return make_plan(spec)
    connect_ray(address, None)
    return make_plan(spec, ray_nodes())
