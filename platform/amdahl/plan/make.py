"""A sweep planned for the nodes it will run on, with its workload's own answers.

`plan_for_nodes` asks the spec's workload what planning needs of it (its parameters' defaults,
whether it preprocesses, which parameter sets share their input batches: `Workload.input_key`),
plans every trial against the nodes given (plan.launches.plan_sweep).

The caller brings the rest: the nodes (the driver discovers them: driver.cluster) and the checks
of the user's code and data that come before planning (driver.planning.make_plan, which needs the
data and search layers this package may not import). Planning builds workload objects but starts
nothing: no Ray, no torch at import.
"""

from __future__ import annotations

from amdahl.plan.launches import SweepPlan, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.schema import SweepSpec
from amdahl.workload.code import make_workload


def plan_for_nodes(spec: SweepSpec, nodes: list[Node]) -> SweepPlan:
    """`spec` planned for `nodes`; its workload must be importable (workload.locate_workload)."""
    workload = make_workload(spec.workload, spec.params)
    return plan_sweep(
        spec,
        nodes,
        workload.defaults,
        preprocesses=workload.preprocesses,
        input_key=lambda params: make_workload(spec.workload, params).input_key(),
    )
