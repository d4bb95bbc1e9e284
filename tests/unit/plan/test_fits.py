"""The plan's memory check: every trial's predicted peak, and refusals of exactly the trials
predicted above the device's memory, each saying memory and what would fit."""

import dataclasses

from amdahl.analysis.memory_model import MemoryFacts, predict_peak, usable_bytes
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec
from amdahl.strategies import micro_steps
from amdahl.sweepdir.driver_files import plan_summary
from workloads.mlp import MLP

FACTS = MemoryFacts(
    param_bytes=10**8,
    grad_bytes=10**8,
    optimizer_bytes=10**8,
    buffer_bytes=0,
    largest_units=(6 * 10**7, 4 * 10**7),
    step_intercept=10**6,
    step_per_sample=2 * 10**6,
)
NODES = [Node(cpus=8.0)]


def _plan(**resources):
    spec = validate_spec(
        {
            "name": "t",
            "workload": "mlp",
            "grid": {"devices": [1, 2], "batch_size": [16, 64], "sync": ["ddp", "fsdp"]},
            "resources": {"cpus_per_device": 1, "cpus_per_data_worker": 1, **resources},
        }
    )
    facts = WorkloadFacts(MLP.defaults, memory=lambda params, precision: FACTS)
    return plan_sweep(spec, NODES, facts)


def test_every_trial_shows_its_predicted_peak_and_nothing_is_refused_without_a_device_size():
    plan = _plan()
    assert not plan.refused
    for t in plan.trials:
        s = t.settings
        micro = micro_steps(s.sync, s.options, s.accumulate_steps)
        expected = predict_peak(FACTS, s.sync, s.devices, s.batch_size, micro).total
        assert t.predicted_peak_mem_bytes == expected
    assert all("predicted_peak_mem_bytes" in t for t in plan_summary(plan)["trials"])


def test_a_device_between_two_predictions_refuses_exactly_the_trials_above_it():
    # between ddp's prediction at batch 16 (fits) and at batch 64 (does not)
    small = predict_peak(FACTS, "ddp", 1, 16).total
    large = predict_peak(FACTS, "ddp", 1, 64).total
    gb = (small + large) / 2 / 0.9 / 1e9
    plan = _plan(device_memory_gb=gb)
    above = {t.trial_id for t in plan.trials if t.predicted_peak_mem_bytes > usable_bytes(gb)}
    assert above and {t.trial_id for t in plan.refused} == above
    for t in plan.refused:
        assert t.refused.startswith("memory: predicted"), t.refused
        assert "per-device batch <=" in t.refused  # what would fit
    two_device_ddp = [
        t for t in plan.refused if t.settings.devices == 2 and t.settings.sync == "ddp"
    ]
    assert two_device_ddp and all("sync fsdp" in t.refused for t in two_device_ddp)
    assert all(t.largest_batch_fits is not None for t in plan.trials)
    # plan.json keeps the size trials were held to, for the report's memory finding
    assert plan_summary(plan)["device_memory_gb"] == gb


def test_the_check_off_runs_everything_and_the_device_size_changes_no_trial_id():
    checked = _plan(device_memory_gb=0.3)
    unchecked = _plan(device_memory_gb=0.3, memory_check=False)
    plain = _plan()
    assert checked.refused and not unchecked.refused
    assert [t.trial_id for t in checked.trials] == [t.trial_id for t in plain.trials]


def test_a_simulated_device_refuses_at_8_and_16_ranks_what_its_stated_memory_cannot_hold():
    """The real path: the driver's memory probe on the simulated accelerator (its tensors are
    real; the probe's cache is the test session's data directory), planned at 8 and 16 ranks
    against the memory its workload states."""
    from amdahl.driver import planning

    params = {"params_per_layer": 2**20, "forward_fixed_ms": 0.0, "forward_per_sample_us": 0.0}
    raw = {
        "name": "sim",
        "workload": "simulated",
        "params": params,
        "grid": {"devices": [8, 16], "batch_size": [16], "sync": ["ddp", "fsdp"]},
        "resources": {"cpus_per_device": 0.1, "cpus_per_data_worker": 0.1},
    }
    roomy = plan_sweep(
        validate_spec(raw), [Node(cpus=4.0)], planning.workload_facts(validate_spec(raw))
    )
    assert not roomy.refused  # 80 GB stated by default
    ddp = next(t for t in roomy.trials if t.settings.sync == "ddp")
    fsdp16 = next(t for t in roomy.trials if t.settings.sync == "fsdp" and t.settings.devices == 16)
    # a device between fsdp's and ddp's predictions: ddp is refused at both counts, fsdp not
    gb = (ddp.predicted_peak_mem_bytes + fsdp16.predicted_peak_mem_bytes) / 2 / 0.9 / 1e9
    raw["params"] = {**params, "stated_memory_gb": gb}
    spec = validate_spec(raw)
    plan = plan_sweep(spec, [Node(cpus=4.0)], planning.workload_facts(spec))
    refused = {(t.settings.sync, t.settings.devices) for t in plan.refused}
    assert ("ddp", 8) in refused and ("ddp", 16) in refused and ("fsdp", 16) not in refused
    assert all("GB the workload states" in t.refused for t in plan.refused)


def test_batch_size_max_is_the_largest_power_of_two_that_fits_each_configuration():
    gb = 1.0
    plan = _plan_grid({"devices": [1, 2], "batch_size": ["max", 16], "sync": ["ddp", "fsdp"]}, gb)
    assert not plan.refused
    picked = {}
    for t in plan.trials:
        s = t.settings
        assert isinstance(s.batch_size, int)
        fits = predict_peak(FACTS, s.sync, s.devices, s.batch_size).total <= usable_bytes(gb)
        assert fits
        if s.batch_size != 16:
            doubled = predict_peak(FACTS, s.sync, s.devices, 2 * s.batch_size).total
            assert doubled > usable_bytes(gb)  # the next power of two would not fit
            picked[s.sync, s.devices] = s.batch_size
    assert picked[("fsdp", 2)] > picked[("ddp", 2)]  # sharding frees room for a larger batch
    assert "grid.batch_size max" in plan.resource_note


def test_batch_size_max_without_a_device_size_is_one_clear_error():
    import pytest

    from amdahl.errors import UserError

    with pytest.raises(UserError, match="set resources.device_memory_gb"):
        _plan_grid({"batch_size": ["max"]}, None)
    with pytest.raises(UserError, match="scaling is strong"):
        validate_spec(
            {
                "name": "t",
                "workload": "mlp",
                "grid": {"batch_size": ["max"]},
                "train": {"scaling": "strong"},
            }
        )


def _plan_grid(grid, gb):
    resources = {"cpus_per_device": 1, "cpus_per_data_worker": 1, "device_memory_gb": gb}
    spec = validate_spec({"name": "t", "workload": "mlp", "grid": grid, "resources": resources})
    facts = WorkloadFacts(MLP.defaults, memory=lambda params, precision: FACTS)
    return plan_sweep(spec, NODES, facts)


def test_an_accumulating_trial_is_predicted_to_hold_its_gradients_across_micro_batches():
    spec = validate_spec(
        {
            "name": "t",
            "workload": "mlp",
            "grid": {"devices": [2], "sync": ["zero1", "fsdp"], "accumulate_steps": [1, 4]},
            "resources": {"cpus_per_device": 1, "cpus_per_data_worker": 1},
        }
    )
    plan = plan_sweep(spec, NODES, WorkloadFacts(MLP.defaults, memory=lambda p, q: FACTS))
    peak = {
        (t.settings.sync, t.settings.accumulate_steps): t.predicted_peak_mem_bytes
        for t in plan.trials
    }
    for sync in ("zero1", "fsdp"):
        assert peak[(sync, 4)] - peak[(sync, 1)] == FACTS.grad_bytes  # whole, even under fsdp


def test_fsdps_options_as_axes_change_its_predicted_peak_in_the_plan():
    """grid.options.fsdp_reshard_after_forward [true, false]: the trial that keeps its units
    gathered is predicted to hold the whole model's parameters (P - P/p at 2 ranks), less
    the two units the default holds."""
    spec = validate_spec(
        {
            "name": "t",
            "workload": "mlp",
            "grid": {
                "devices": [2],
                "batch_size": [16],
                "sync": ["fsdp"],
                "options": {"fsdp_reshard_after_forward": [True, False]},
            },
            "resources": {"cpus_per_device": 1, "cpus_per_data_worker": 1},
        }
    )
    units = dataclasses.replace(FACTS, largest_units=(3 * 10**7, 2 * 10**7))
    facts = WorkloadFacts(MLP.defaults, memory=lambda params, precision: units)
    plan = plan_sweep(spec, NODES, facts)
    peaks = {
        t.settings.options.get("fsdp_reshard_after_forward", True): t.predicted_peak_mem_bytes
        for t in plan.trials
    }
    # (10**8 - 10**8 / 2) gathered against (3e7 + 2e7) / 2
    assert peaks[False] - peaks[True] == 5 * 10**7 - 2.5 * 10**7
