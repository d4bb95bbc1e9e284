"""`grid.activation_checkpointing` in the plan (issue 48): a trial at `none` keeps its id, a
workload that names no blocks and TorchScript are refused with the fix, and the memory check
predicts a checkpointed trial from the line the probe measured with checkpointing, so a batch
that does not fit plain is told that checkpointing would fit it."""

import dataclasses

from amdahl.analysis.memory_model import MemoryFacts, predict_peak, usable_bytes
from amdahl.plan.launches import WorkloadFacts, plan_sweep
from amdahl.plan.resources import Node
from amdahl.spec.load import validate_spec
from workloads.gpt import GPT

FACTS = MemoryFacts(
    param_bytes=10**8,
    grad_bytes=10**8,
    optimizer_bytes=10**8,
    buffer_bytes=0,
    largest_units=(6 * 10**7, 4 * 10**7),
    step_intercept=10**6,
    step_per_sample=4 * 10**6,
    checkpointed={"full": (2 * 10**6, 10**6), "selective": (10**6, 2.5 * 10**6)},
)
NODES = [Node(cpus=8.0)]


def _plan(grid, names_blocks=True, **resources):
    spec = validate_spec(
        {
            "name": "t",
            "workload": "gpt",
            "grid": {"batch_size": [64], **grid},
            "resources": {"cpus_per_device": 1, "cpus_per_data_worker": 1, **resources},
        }
    )
    facts = WorkloadFacts(
        GPT.defaults, memory=lambda params, precision: FACTS, names_blocks=names_blocks
    )
    return plan_sweep(spec, NODES, facts)


def test_none_keeps_the_trial_id_and_each_mode_is_its_own_trial():
    before = _plan({})
    modes = _plan({"activation_checkpointing": ["none", "selective", "full"]})
    assert [t.trial_id for t in before.trials] == [modes.trials[0].trial_id]
    assert len({t.trial_id for t in modes.trials}) == 3 and not modes.refused
    for t in modes.trials:
        mode = t.settings.activation_checkpointing
        assert (
            t.predicted_peak_mem_bytes
            == predict_peak(FACTS, "ddp", 1, 64, checkpointing=mode).total
        )
    assert [t.predicted_peak_mem_bytes for t in modes.trials] == sorted(
        (t.predicted_peak_mem_bytes for t in modes.trials), reverse=True
    )


def test_a_workload_without_blocks_and_torchscript_are_refused_with_the_fix():
    plan = _plan({"activation_checkpointing": ["none", "full"]}, names_blocks=False)
    [refused] = plan.refused
    assert refused.settings.activation_checkpointing == "full"
    assert "names no blocks" in refused.refused and "blocks(model)" in refused.refused
    plan = _plan({"activation_checkpointing": ["full"], "compile": ["torchscript", "eager"]})
    [refused] = plan.refused
    assert refused.settings.compile == "torchscript" and "TorchScript" in refused.refused


def test_a_batch_too_large_plain_is_told_that_checkpointing_fits_it():
    plain = predict_peak(FACTS, "ddp", 1, 64).total
    full = predict_peak(FACTS, "ddp", 1, 64, checkpointing="full").total
    gb = (plain + full) / 2 / 0.9 / 1e9
    plan = _plan({"activation_checkpointing": ["none", "full"]}, device_memory_gb=gb)
    [refused] = plan.refused
    assert refused.settings.activation_checkpointing == "none"
    assert "activation_checkpointing full" in refused.refused
    assert full <= usable_bytes(gb) < plain


def test_facts_without_a_measured_line_predict_the_plain_one():
    plain = dataclasses.replace(FACTS, checkpointed={})
    assert predict_peak(plain, "ddp", 1, 64, checkpointing="full").total == (
        predict_peak(plain, "ddp", 1, 64).total
    )
    assert MemoryFacts.from_dict(FACTS.as_dict()) == FACTS


def test_batch_size_max_is_resolved_per_checkpointing_mode_and_says_so():
    gb = predict_peak(FACTS, "ddp", 1, 64).total / 0.9 / 1e9
    plan = _plan(
        {"batch_size": ["max"], "activation_checkpointing": ["none", "full"]},
        device_memory_gb=gb,
    )
    batches = {t.settings.activation_checkpointing: t.settings.batch_size for t in plan.trials}
    assert batches["none"] == 64 and batches["full"] > 64
    note = plan.resource_note
    assert f"d1 fp32 ddp -> 64, d1 fp32 ddp ac-full -> {batches['full']}" in note, note
