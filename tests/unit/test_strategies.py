"""The sync-strategy table (strategies.py) against what reads it and what it describes: sync.py's
implementations, the schema, the planner and the step-time model (docs/architecture.md, "How to
add ...", "A sync strategy")."""

import subprocess
import sys
from typing import get_args

import pytest
import torch

from amdahl import strategies
from amdahl.analysis.comm import comm_volume, options_from_mapping
from amdahl.errors import UserError
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec
from amdahl.spec.schema import GridSpec, OptionsSpec
from amdahl.strategies import NAMES, OPTION_DEFAULTS, STRATEGIES, micro_steps
from amdahl.worker.sync import IMPLEMENTATIONS as IMPLEMENTED

CPU = [Node(cpus=4.0)]
GPU = [Node(cpus=16.0, gpus=2.0)]


def _plan(nodes=CPU, **sections):
    return plan_sweep(
        validate_spec({"name": "t", "workload": "mlp", **sections}), nodes, WorkloadFacts({})
    )


def test_sync_py_implements_exactly_the_table():
    assert set(IMPLEMENTED) == set(NAMES)
    for name, cls in IMPLEMENTED.items():
        assert cls.name == name, f"{cls.__name__}.name is {cls.name!r}, registered as {name!r}"


def test_the_schema_offers_exactly_the_table_and_names_it_in_errors():
    (sync,) = get_args(GridSpec.model_fields["sync"].annotation)
    assert get_args(sync) == NAMES
    with pytest.raises(UserError) as refused:
        validate_spec({"workload": "mlp", "grid": {"sync": ["dpp"]}})
    assert all(repr(name) in str(refused.value) for name in NAMES)
    for name in NAMES:
        assert validate_spec({"workload": "mlp", "grid": {"sync": [name]}}).grid.sync == [name]


def test_every_option_in_the_table_is_a_spec_option_with_the_tables_default():
    used = {o for s in STRATEGIES.values() for o in s.options}
    assert used == set(OPTION_DEFAULTS), "an option no strategy reads, or one without default"
    for option, default in OPTION_DEFAULTS.items():
        assert option in OptionsSpec.model_fields, f"options.{option} is not in the schema"
        assert OptionsSpec().model_dump()[option] == default
        assert getattr(options_from_mapping({}), option) == default
    for s in STRATEGIES.values():
        assert s.micro_steps_option in (None, *s.options)


def test_a_trial_carries_exactly_the_options_its_strategy_reads():
    # Every option away from its default, so that none is left out for being at it.
    options = {"bucket_cap_mb": 1, "powersgd_rank": 3, "accumulate_steps": 2}
    options |= {"local_sgd_every": 7, "ps_shards": 5}
    options |= {"fsdp_reshard_after_forward": False, "fsdp_param_dtype": "fp32"}
    options |= {"fsdp_reduce_dtype": "fp32"}
    assert set(options) == set(OPTION_DEFAULTS)
    plan = _plan(grid={"sync": list(NAMES)}, options=options)
    for t in plan.trials:
        assert tuple(t.settings.options) == STRATEGIES[t.settings.sync].options


def test_micro_steps():
    assert micro_steps("accumulate", {}, 1) == OPTION_DEFAULTS["accumulate_steps"] == 4
    assert micro_steps("accumulate", {"accumulate_steps": 3}, 1) == 3
    assert micro_steps("ddp", {"accumulate_steps": 3}, 1) == 1
    assert micro_steps("none", {}, 1) == 1
    # the accumulate_steps axis sets every strategy's
    assert all(micro_steps(name, {}, 4) == 4 for name in NAMES if name != "accumulate")
    # The worker's implementation agrees with the table (strategies buildable without a
    # process group: all but the CUDA-only ones).
    for options, axis in (({}, 1), ({"accumulate_steps": 3}, 1), ({}, 2)):
        for name, cls in IMPLEMENTED.items():
            if STRATEGIES[name].needs_cuda is None:
                built = cls(options, torch.device("cpu"), axis)
                assert built.micro_steps == micro_steps(name, options, axis), name


def test_every_strategy_has_a_step_model_volume_that_agrees_with_the_table():
    assert comm_volume("no_such_sync", 2, 4e6) is None
    for name, s in STRATEGIES.items():
        on_two = comm_volume(name, 2, 4e6)
        assert on_two is not None, f"analysis/comm.py's comm_volume has no case for {name}"
        assert (on_two.bytes > 0) == s.communicates, name
        alone = comm_volume(name, 1, 4e6)
        assert (alone.bytes > 0) == (s.communicates and s.communicates_alone), name


def test_where_communication_lands_is_consistent():
    for name, s in STRATEGIES.items():
        assert set(s.comm_phases) <= set(strategies.ALL_PHASES), name
        assert bool(s.comm_phases) == s.communicates, name
        if s.wire_factor is not None:
            assert 0 < s.wire_factor <= 1, name
    assert [n for n, s in STRATEGIES.items() if not s.communicates] == ["none"]


def test_cuda_only_strategies_are_refused_on_cpu_with_the_tables_reason():
    cuda_only = {n: s.needs_cuda for n, s in STRATEGIES.items() if s.needs_cuda}
    assert cuda_only, "the test needs a CUDA-only strategy (ddp_bf16)"
    refused = {t.settings.sync: t.refused for t in _plan(grid={"sync": list(NAMES)}).trials}
    for name in NAMES:
        if name in cuda_only:
            assert refused[name] == f"sync={name}: {cuda_only[name]}"
        else:
            assert refused[name] is None, name
    on_gpu = _plan(GPU, grid={"sync": list(cuda_only)}, resources={"use_gpu": True})
    assert [t.refused for t in on_gpu.trials] == [None] * len(cuda_only)


def test_incompatible_axis_values_are_refused_with_the_tables_reason():
    pairs = [
        (n, axis, value, why) for n, s in STRATEGIES.items() for axis, value, why in s.incompatible
    ]
    assert pairs, "the test needs an incompatibility (fsdp with torchscript)"
    for name, axis, value, why in pairs:
        trials = _plan(grid={"sync": [name], axis: [value]}).trials
        assert [t.refused for t in trials] == [f"{axis}={value} with sync={name}: {why}"]
        (values,) = get_args(GridSpec.model_fields[axis].annotation)
        others = [v for v in get_args(values) if v != value]
        fine = _plan(grid={"sync": [name], axis: others}).trials
        assert all(t.refused is None for t in fine if getattr(t.settings, axis) in others), name


def test_the_table_loads_nothing_heavy():
    probe = (
        "import sys, amdahl.strategies; "
        "print(sorted(m for m in ('torch', 'ray', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
