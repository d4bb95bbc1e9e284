"""The step-time model over the knobs a sweep turns per configuration (issue 48): each family
communicates and overlaps at its own options (a `grid.options.bucket_cap_mb` list, sync
accumulate's `accumulate_steps`), and a checkpointed family's compute holds the recomputed
forward where only its non-checkpointed twin was measured."""

import json

import pytest
from report_rows import ALPHA, BANDWIDTH, CALIBRATION, GRAD, conform, row

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import Link, comm_volume
from amdahl.analysis.configs import group_configs
from amdahl.analysis.stepmodel import ModelInputs, combine, fit
from amdahl.spec.schema import OptionsSpec

LINK = Link(ALPHA, BANDWIDTH, "intra-node")
A, B, WAIT = 2e-3, 5e-5, 1e-3  # the compute line (s, s per sample) and the data wait
#: gamma of the several-bucket families (overlapping); one bucket cannot overlap: gamma 1.
GAMMA = 2.5


def _inputs(rows, options: OptionsSpec | None = None) -> ModelInputs:
    cal = Calibration.from_dict(CALIBRATION)
    return ModelInputs(group_configs(conform(rows)), cal, options or OptionsSpec())


def _none_rows(devices=(1, 2, 4), **extra) -> list[dict]:
    """sync none at every device count and batch: the compute line, no contention."""
    rows = []
    for p in devices:
        for bs in (32, 64, 128, 256):
            wall = A + B * bs + WAIT
            rows.append(
                row(p, bs, "none", bs * p / wall, wall=wall, data_wait_s=WAIT, **extra)
                | {"trial_id": f"none-d{p}b{bs}{json.dumps(extra)}"}
            )
    return rows


def _ddp_rows(cap: float) -> list[dict]:
    """ddp at 1, 2 and 4 devices with `grid.options.bucket_cap_mb` at `cap`: as the model
    would have it with that cap's buckets (several overlap at GAMMA, one does not)."""
    options = OptionsSpec(bucket_cap_mb=cap)
    gamma = 1.0 if cap * 2**20 >= GRAD else GAMMA
    rows = []
    for p in (1, 2, 4):
        for bs in (32, 64, 128, 256):
            tn = comm_volume("ddp", p, GRAD, options).seconds(LINK)
            wall = combine(A + B * bs, tn, gamma) + WAIT
            r = row(p, bs, "ddp", bs * p / wall, wall=wall, data_wait_s=WAIT)
            rows.append(
                r
                | {
                    "trial_id": f"ddp-d{p}b{bs}c{cap}",
                    "options": json.dumps({"bucket_cap_mb": cap}),
                }
            )
    return rows


def test_each_bucket_size_communicates_and_overlaps_as_its_own():
    """grid.options.bucket_cap_mb: [1, 100] over a 4 MB gradient: four buckets (four latency
    terms per step, overlapping the backward) against one (one latency term, none overlapped);
    the sweep's own options (the default 25 MB, one bucket) describe neither alone."""
    model = fit(_inputs([*_none_rows(), *_ddp_rows(1), *_ddp_rows(100)]))
    ddp = {f.options.bucket_cap_mb: f for f in model.families.values() if f.sync == "ddp"}
    assert set(ddp) == {1, 100}
    many, one = model.predict(ddp[1], 8, 128.0), model.predict(ddp[100], 8, 128.0)
    assert many.volume.latency_steps == 4 * one.volume.latency_steps == 4 * 2 * (8 - 1)
    assert one.volume.bytes == many.volume.bytes  # the gradient: the same bytes either way
    assert ddp[100].gamma == 1.0 and "one DDP bucket" in ddp[100].gamma_source
    assert ddp[1].gamma == pytest.approx(GAMMA, rel=0.05)
    for cap, pred, gamma in ((1, many, GAMMA), (100, one, 1.0)):
        tn = comm_volume("ddp", 8, GRAD, OptionsSpec(bucket_cap_mb=cap)).seconds(LINK)
        assert pred.comm_s == pytest.approx(tn, rel=0.02)
        expected = 128 * 8 / (combine(A + B * 128, tn, gamma) + WAIT)
        assert pred.throughput == pytest.approx(expected, rel=0.02)
    # DDP's compute is sync none's, whatever the bucket size: none's trials record no options
    assert "borrowed from sync none" in ddp[1].compute_source
    assert "borrowed from sync none" in ddp[100].compute_source


def test_a_family_whose_rows_record_no_option_ran_the_sweeps():
    """Rows before the `options` column (none records one) ran the spec's options: its bucket
    size counts the buckets."""
    rows = [{**r, "options": None} for r in _ddp_rows(1)]
    model = fit(_inputs([*_none_rows(), *rows], OptionsSpec(bucket_cap_mb=1)))
    ddp = next(f for f in model.families.values() if f.sync == "ddp")
    assert ddp.options.bucket_cap_mb == 1
    assert model.predict(ddp, 8, 128.0).volume.latency_steps == 4 * 2 * (8 - 1)


def test_accumulation_of_a_family_divides_its_communication_per_sample():
    """sync accumulate under grid.options.accumulate_steps [2, 8]: each family computes its own
    passes per optimizer step and communicates once per step, so per sample the family at 8
    communicates a quarter of the one at 2; the family at 8 is not measured (its trial ran out
    of memory), so only its own options can say its passes."""
    rows = _none_rows()
    for p in (1, 2, 4):
        for bs in (32, 64, 128, 256):
            tn = comm_volume("accumulate", p, GRAD).seconds(LINK)
            wall = 2 * (A + B * bs) + tn + WAIT
            r = row(p, bs, "accumulate", bs * p * 2 / wall, wall=wall, data_wait_s=WAIT)
            rows.append(
                r
                | {
                    "trial_id": f"acc-d{p}b{bs}",
                    "options": json.dumps({"accumulate_steps": 2}),
                    "micro_steps": 2,
                    "global_batch": bs * p * 2,
                }
            )
    oom = row(2, 64, "accumulate", status="oom", micro_steps=None, trial_id="acc8")
    rows.append(oom | {"options": json.dumps({"accumulate_steps": 8})})
    model = fit(_inputs(rows))
    acc = {f.options.accumulate_steps: f for f in model.families.values() if f.sync == "accumulate"}
    assert (acc[2].micro, acc[8].micro) == (2, 8)
    two, eight = model.predict(acc[2], 8, 128.0), model.predict(acc[8], 8, 128.0)
    assert eight.comm_s == pytest.approx(two.comm_s)  # once per optimizer step
    per_sample = [pred.comm_s / (128 * 8 * f.micro) for pred, f in ((two, acc[2]), (eight, acc[8]))]
    assert per_sample[1] == pytest.approx(per_sample[0] / 4)
    assert eight.compute_s == pytest.approx(4 * two.compute_s, rel=0.02)


#: Compute at each device count over compute at one (the cores' load), measured only without
#: checkpointing; and the recompute's cost, measured on one device.
CONTENTION = {1: 1.0, 2: 1.2, 4: 1.5}
RECOMPUTE = 1.3
#: Hardware FLOPs per sample without and with full checkpointing (the GPT rows' counts).
FLOPS = {"none": 44564480.0, "full": 54001664.0}


def _checkpointing_rows(sync: str, devices, factor: float, ac: str, **extra) -> list[dict]:
    rows = []
    for p in devices:
        for bs in (32, 64, 128, 256):
            wall = (A + B * bs) * CONTENTION[p] * factor + WAIT
            r = row(p, bs, sync, bs * p / wall, wall=wall, data_wait_s=WAIT, **extra)
            rows.append(
                r
                | {
                    "trial_id": f"{sync}-{ac}-d{p}b{bs}",
                    "activation_checkpointing": ac,
                    "flops_hardware": FLOPS[ac],
                }
            )
    return rows


def test_a_checkpointed_family_at_an_unmeasured_count_holds_the_recompute():
    """Checkpointing measured on one device only (1.3x the compute there), the counts above it
    without: at 4 devices the checkpointed family computes 1.3x what the family without
    checkpointing measured there (its cores' load included), not its own 1-device line."""
    rows = [
        *_checkpointing_rows("none", (1, 2, 4), 1.0, "none"),
        *_checkpointing_rows("none", (1,), RECOMPUTE, "full"),
        *_checkpointing_rows("ddp", (1,), RECOMPUTE, "full"),
    ]
    model = fit(_inputs(rows))
    fams = {(f.sync, f.settings["activation_checkpointing"]): f for f in model.families.values()}
    for sync in ("none", "ddp"):
        full = fams[(sync, "full")]
        assert full.recompute == pytest.approx(RECOMPUTE, rel=1e-3)
        pred = model.predict(full, 4, 128.0)
        expected = (A + B * 128) * CONTENTION[4] * RECOMPUTE
        assert pred.compute_s == pytest.approx(expected, rel=0.02), sync
        assert any("without activation checkpointing" in c for c in pred.caveats), sync
        assert "measured: 1-device compute" in full.recompute_source
    # where the checkpointed family measured its own compute, that stands
    one = model.predict(fams[("none", "full")], 1, 128.0)
    assert one.compute_s == pytest.approx((A + B * 128) * RECOMPUTE, rel=1e-3)
    assert not any("checkpointing" in c for c in one.caveats)


def test_a_checkpointed_family_without_compute_takes_its_twins_times_the_hardware_flops():
    """ddp with full checkpointing measured at 2 devices only, where its trials record no
    comm_s (no compute of its own): its compute is ddp's without checkpointing x the ratio of
    the hardware FLOPs the two counted per sample (the recomputed forward), labelled so."""
    flops = FLOPS["full"] / FLOPS["none"]
    rows = [
        *_checkpointing_rows("none", (1, 2, 4), 1.0, "none"),
        *_checkpointing_rows("ddp", (1,), 1.0, "none"),
    ]
    for bs in (32, 64, 128, 256):
        compute = (A + B * bs) * CONTENTION[2] * flops
        wall = compute + comm_volume("ddp", 2, GRAD).seconds(LINK) + WAIT
        r = row(2, bs, "ddp", bs * 2 / wall, wall=wall, data_wait_s=WAIT)
        r |= {"trial_id": f"ddp-full-d2b{bs}", "activation_checkpointing": "full"}
        rows.append(r | {"flops_hardware": FLOPS["full"]})
    model = fit(_inputs(rows))
    full = next(
        f
        for f in model.families.values()
        if f.sync == "ddp" and f.settings["activation_checkpointing"] == "full"
    )
    assert full.recompute == pytest.approx(flops) and "hardware FLOPs" in full.recompute_source
    pred = model.predict(full, 4, 128.0)
    assert pred.compute_s == pytest.approx((A + B * 128) * CONTENTION[4] * flops, rel=0.02)
    assert pred.step_s > pred.compute_s  # and its communication on top
