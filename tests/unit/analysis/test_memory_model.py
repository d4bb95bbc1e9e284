"""The memory model's terms per strategy, and the largest batch it says fits (pure: no torch)."""

import pytest

from amdahl.analysis.memory_model import (
    UNBOUNDED_BATCH,
    MemoryFacts,
    fit_overhead,
    largest_batch,
    largest_power_of_two,
    predict_peak,
    usable_bytes,
)

MB = 1e6
FACTS = MemoryFacts(
    param_bytes=100 * MB,
    grad_bytes=100 * MB,
    optimizer_bytes=200 * MB,  # AdamW: two moments
    buffer_bytes=1 * MB,
    largest_units=(60 * MB, 30 * MB),
    step_intercept=5 * MB,
    step_per_sample=2 * MB,
)


def _parts(sync, devices=4, batch=10, micro_steps=1):
    return predict_peak(FACTS, sync, devices, batch, micro_steps).parts


def test_replicated_strategies_hold_the_whole_state_and_ddp_its_buckets_too():
    none, ddp = _parts("none"), _parts("ddp")
    assert none["parameters"] == ddp["parameters"] == 100 * MB
    assert none["optimizer"] == ddp["optimizer"] == 200 * MB
    assert none["buckets"] == 0 and ddp["buckets"] == 200 * MB  # buckets + the copy beside them
    assert none["step"] == 5 * MB + 10 * 2 * MB


def test_zero1_shards_the_optimizer_and_fsdp_everything():
    zero1, fsdp = _parts("zero1"), _parts("fsdp")
    assert zero1["optimizer"] == 50 * MB and zero1["parameters"] == 100 * MB
    assert fsdp["optimizer"] == 50 * MB and fsdp["parameters"] == 25 * MB
    # the two largest units gathered whole (less their shards), and the gradient shards
    assert fsdp["gathered parameters"] == pytest.approx((60 + 30) * 0.75 * MB + 25 * MB)
    assert fsdp["buckets"] == 0


def test_the_parameter_server_keeps_the_optimizer_state_off_the_workers():
    assert _parts("param_server")["optimizer"] == 0


def test_accumulation_holds_the_gradients_across_micro_batches():
    assert _parts("accumulate", micro_steps=4)["held gradients"] == 100 * MB
    assert _parts("ddp")["held gradients"] == 0
    assert _parts("zero1", micro_steps=2)["held gradients"] == 100 * MB
    # FSDP2 without gradient sync keeps the unsharded gradients, not their shards
    assert _parts("fsdp", micro_steps=4)["held gradients"] == 100 * MB
    assert _parts("fsdp")["held gradients"] == 0


def test_fsdp_without_resharding_keeps_every_units_parameters_gathered():
    """P - P/p of gathered parameters instead of the two largest units' (4 ranks: 75 MB)."""
    kept = {"fsdp_reshard_after_forward": False}
    parts = predict_peak(FACTS, "fsdp", 4, 10, options=kept).parts
    assert parts["gathered parameters"] == pytest.approx(100 * 0.75 * MB + 25 * MB)
    assert parts["parameters"] == 25 * MB and parts["step"] == 25 * MB
    default = predict_peak(FACTS, "fsdp", 4, 10, options={"fsdp_reshard_after_forward": True})
    assert default.parts == _parts("fsdp")


def test_fsdp_param_dtype_halves_the_gathered_copy_and_an_fp32_steps_activations():
    """bf16: the gathered units at 2 of 4 bytes (the fp32 shards and gradient shards stay),
    and the fp32 probe's step line halved; under a bf16 precision the line stays."""
    bf16 = {"fsdp_param_dtype": "bf16"}
    parts = predict_peak(FACTS, "fsdp", 4, 10, options=bf16).parts
    assert parts["gathered parameters"] == pytest.approx((60 + 30) * 0.75 * MB / 2 + 25 * MB)
    assert parts["parameters"] == 25 * MB
    assert parts["step"] == pytest.approx(25 * MB / 2)
    autocast = predict_peak(FACTS, "fsdp", 4, 10, options=bf16, precision="bf16").parts
    assert autocast["step"] == 25 * MB
    # bf16_weights: the parameters are bf16 already, nothing to cast
    halved = predict_peak(FACTS, "fsdp", 4, 10, options=bf16, precision="bf16_weights")
    assert halved.parts == _parts("fsdp")
    both = {**bf16, "fsdp_reshard_after_forward": False}
    kept = predict_peak(FACTS, "fsdp", 4, 10, options=both).parts
    assert kept["gathered parameters"] == pytest.approx(100 * 0.75 * MB / 2 + 25 * MB)
    # fp32 is the parameters' own dtype; another strategy ignores fsdp's options
    assert predict_peak(FACTS, "fsdp", 4, 10, options={"fsdp_param_dtype": "fp32"}).parts == (
        _parts("fsdp")
    )
    assert predict_peak(FACTS, "ddp", 4, 10, options=both).parts == _parts("ddp")


def test_the_largest_batch_follows_fsdps_options():
    gb = 0.5
    kept = {"fsdp_reshard_after_forward": False}
    bf16 = {"fsdp_param_dtype": "bf16"}
    default = largest_batch(FACTS, "fsdp", 4, gb)
    assert largest_batch(FACTS, "fsdp", 4, gb, options=kept) < default
    limit = largest_batch(FACTS, "fsdp", 4, gb, options=bf16)
    assert limit > default
    assert predict_peak(FACTS, "fsdp", 4, limit, options=bf16).total <= usable_bytes(gb)
    assert predict_peak(FACTS, "fsdp", 4, limit + 1, options=bf16).total > usable_bytes(gb)


def test_the_largest_batch_fits_and_one_more_does_not():
    gb = 1.0
    limit = largest_batch(FACTS, "ddp", 2, gb)
    assert predict_peak(FACTS, "ddp", 2, limit).total <= usable_bytes(gb)
    assert predict_peak(FACTS, "ddp", 2, limit + 1).total > usable_bytes(gb)
    # sharding frees room for a larger batch
    assert largest_batch(FACTS, "fsdp", 2, gb) > limit
    assert largest_batch(FACTS, "ddp", 2, 0.1) == 0  # the state alone does not fit
    flat = MemoryFacts(1, 1, 1, 0, (1,), 10.0, 0.0)
    assert largest_batch(flat, "none", 1, 1.0) == UNBOUNDED_BATCH


def test_powers_of_two_and_the_overhead_from_a_sweeps_rows():
    assert [largest_power_of_two(n) for n in (0, 1, 5, 64, 100)] == [0, 1, 4, 64, 64]
    assert fit_overhead([]) == 0
    assert fit_overhead([(10, 14), (20, 23), (30, 35)]) == 4
    assert fit_overhead([(10, 9)]) == 0  # never below nothing


def test_facts_round_trip_through_plain_data():
    assert MemoryFacts.from_dict(FACTS.as_dict()) == FACTS
