"""Bottleneck naming (with the stated thresholds), exposed communication, the alpha-beta
prediction, MFU, quality flags, the recommendation, failures and batch limits."""

import pytest
from report_rows import PARAMS, conform, row, scaling_rows

from amdahl.analysis.alphabeta import ring_allreduce_s
from amdahl.report import report_from_rows
from amdahl.report.bottleneck import THRESHOLD_TEXT, THRESHOLDS
from amdahl.report.diagnose import LOADER_IN_PROCESS_TIP


def _diag(report, label):
    return next(d for d in report.diagnoses if d.config.label == label)


def _report(rows, **kw):
    return report_from_rows(conform(rows), **kw)


def test_communication_bound_when_exposed_comm_passes_its_threshold():
    r = _report(scaling_rows())
    d4 = _diag(r, "d4 b128 fp32 eager w1 ddp")
    # backward 0.18 s with ddp against 0.095 s alone: 0.085 s exposed of a 0.256 s step
    assert d4.comm.median == pytest.approx(0.085)
    assert d4.segments["exposed comm"] == pytest.approx(0.085)
    assert d4.segments["backward"] == pytest.approx(0.095)
    assert d4.bottleneck == "communication"
    assert "33%" in d4.evidence
    assert any("batch_size" in tip for tip in d4.advice)
    # at p=2 the exposed 0.025 s is 16% of 0.16 s: under the 20% threshold
    d2 = _diag(r, "d2 b128 fp32 eager w1 ddp")
    assert d2.comm.median == pytest.approx(0.025)
    assert d2.bottleneck != "communication"
    assert THRESHOLDS["communication"] == 0.20


def test_data_loading_named_above_five_percent_of_the_step_only():
    slow = _report([row(1, throughput=100.0, phases=(0.3, 0.3, 0.5, 0.18))])  # wall 1.28 s
    (d,) = slow.diagnoses
    assert d.bottleneck == "data loading"
    assert "23%" in d.evidence
    fine = _report([row(1, throughput=1000.0, phases=(0.005, 0.04, 0.08, 0.003))])  # 3.9%
    assert fine.diagnoses[0].bottleneck == "compute"
    assert fine.diagnoses[0].shares["data loading"] == pytest.approx(0.005 / 0.128)


def test_a_cpu_dataloader_waited_on_is_told_to_try_no_worker_process():
    slow = (0.3, 0.3, 0.5, 0.18)  # data wait 23% of the step
    loader = dict(input="torch_loader", data_workers=1)
    (d,) = _report([row(1, throughput=100.0, phases=slow, **loader)]).diagnoses
    assert d.bottleneck == "data loading" and d.advice[0] == LOADER_IN_PROCESS_TIP
    # not where it already has none, nor for Ray Data
    for other in (dict(loader, data_workers=0), dict(loader, input="ray_data")):
        (d,) = _report([row(1, throughput=100.0, phases=slow, **other)]).diagnoses
        assert LOADER_IN_PROCESS_TIP not in d.advice, other


def test_gpu_data_wait_is_named_with_host_device_transfer():
    r = _report([row(1, throughput=100.0, phases=(0.3, 0.3, 0.5, 0.18), device_name="H100")])
    assert r.diagnoses[0].bottleneck == "data loading or host-device transfer"


def test_time_outside_the_timed_phases_is_framework_overhead():
    # phases 0.064 s of a 0.128 s step: half the step is outside them
    r = _report([row(1, throughput=1000.0, phases=(0.0, 0.02, 0.04, 0.004))])
    (d,) = r.diagnoses
    assert d.segments["other"] == pytest.approx(0.064)
    assert d.bottleneck == "Python/framework overhead"


@pytest.mark.parametrize(
    ("device", "name"), [("cpu", "Python/framework overhead"), ("H100", "kernel-launch overhead")]
)
def test_fixed_per_step_cost_from_the_batch_size_sweep(device, name):
    # compute 2.1 ms at batch 64, 2.2 ms at 128: intercept 2.0 ms = 91-95% of compute
    rows = [
        row(
            1, 64, throughput=64 / 0.0021, phases=(0.0, 0.0007, 0.0013, 0.0001), device_name=device
        ),
        row(
            1,
            128,
            throughput=128 / 0.0022,
            phases=(0.0, 0.0007, 0.0014, 0.0001),
            device_name=device,
        ),
    ]
    r = _report(rows)
    for d in r.diagnoses:
        assert d.fixed_s == pytest.approx(0.002)
        assert d.bottleneck == name


def test_compute_bound_when_nothing_passes_a_threshold():
    (d,) = _report([row(1, throughput=1000.0, phases=(0.001, 0.04, 0.08, 0.007))]).diagnoses
    assert d.bottleneck == "compute"
    assert "99%" in d.evidence


def test_exposed_comm_within_the_spread_is_no_measurable_difference():
    rows = []
    for i, (b_ddp, b_none) in enumerate(((0.10, 0.10), (0.15, 0.14), (0.20, 0.19))):
        rows.append(row(2, throughput=1000.0, repeat=i, phases=(0.0, 0.05, b_ddp, 0.0)))
        rows.append(
            row(2, sync="none", throughput=1000.0, repeat=i, phases=(0.0, 0.05, b_none, 0.0))
        )
    d = _diag(_report(rows), "d2 b128 fp32 eager w1 ddp")
    assert d.comm.median == pytest.approx(0.01)
    assert not d.comm_measurable
    assert d.bottleneck != "communication"
    assert any("no measurable difference" in a for a in d.also)


def test_unknown_comm_without_a_sync_none_twin_says_how_to_measure_it():
    d = _report([row(2, throughput=1000.0, phases=(0.0, 0.05, 0.2, 0.0))]).diagnoses[0]
    assert d.comm is None
    assert any("add sync none" in a for a in d.also)


def test_alpha_beta_prediction_and_mfu_from_calibration():
    calib = {
        "alpha_s": 50e-6,
        "bandwidth_Bps": 1e9,
        "devices": 2,
        "grad_bytes_by_params": {PARAMS: 4e6},
        "peak_flops": {"fp32": 1e10, "bf16": 4e10},
        "peak_source": "measured: test",
    }
    rows = scaling_rows()
    for r in rows:
        r["achieved_flops"] = r["throughput"] * 1e6
    rep = _report(rows, calibration=calib)
    d4 = _diag(rep, "d4 b128 fp32 eager w1 ddp")
    assert d4.grad_bytes == 4e6
    assert d4.predicted_comm_s == pytest.approx(ring_allreduce_s(4, 4e6, 50e-6, 1e9))
    assert d4.mfu == pytest.approx(2000 * 1e6 / (4 * 1e10))
    assert d4.mfu_peak == "fp32"
    assert _diag(rep, "d4 b128 fp32 eager w1 none").predicted_comm_s is None
    # no gradient bytes anywhere: no prediction, no crash
    rep2 = _report(rows, calibration={"alpha_s": 50e-6, "bandwidth_Bps": 1e9})
    assert _diag(rep2, "d4 b128 fp32 eager w1 ddp").predicted_comm_s is None


def test_worse_quality_is_flagged_and_never_recommended():
    rows = [
        row(1, throughput=1000.0, val_accuracy=0.70, val_loss=0.5),
        row(1, throughput=3000.0, precision="bf16", val_accuracy=0.60, val_loss=0.7),
        row(1, throughput=2000.0, precision="fp16", val_accuracy=0.698, val_loss=0.5),
    ]
    rep = _report(rows)
    flags = {q.config.label: q.worse for q in rep.quality.values() if q.reference is not q.config}
    assert flags == {"d1 b128 bf16 eager w1 ddp": True, "d1 b128 fp16 eager w1 ddp": False}
    best = rep.recommendation.picks[0]
    assert best.goal == "throughput" and best.config.label == "d1 b128 fp16 eager w1 ddp"
    assert [c.label for c, _ in rep.recommendation.excluded] == ["d1 b128 bf16 eager w1 ddp"]


def test_recommendation_by_throughput_per_device_and_cost_with_ties():
    rows = scaling_rows()
    rows.append(row(2, batch=256, throughput=1650.0))
    rep = _report(rows, price=3.6)
    picks = {p.goal: p for p in rep.recommendation.picks}
    assert picks["throughput"].config.label == "d4 b128 fp32 eager w1 ddp"  # 2000 (none excluded)
    assert picks["throughput per device"].config.devices == 1
    cost = picks["cost per million samples"]
    assert cost.config.devices == 1
    assert cost.value.median == pytest.approx(3.6 * 1e6 / 1000 / 3600)  # $1.00
    # sync none at p > 1 is never recommended, even though it is the fastest row
    excluded = [c.label for c, _ in rep.recommendation.excluded]
    assert "d4 b128 fp32 eager w1 none" in excluded
    # single repeats: spread 0, so 1650 vs 1600 is a measurable difference, not a tie
    assert picks["throughput"].ties == []
    front = [c.label for c in rep.recommendation.pareto]
    assert front[0].startswith("d1 ") and front[-1] == "d4 b128 fp32 eager w1 ddp"


def test_ties_within_the_spread_are_named():
    rows = [row(1, throughput=x, repeat=i) for i, x in enumerate((900.0, 1000.0, 1100.0))]
    rows += [row(1, batch=256, throughput=x, repeat=i) for i, x in enumerate((1000.0, 1030.0))]
    pick = _report(rows).recommendation.picks[0]
    assert pick.config.label == "d1 b256 fp32 eager w1 ddp"
    assert [c.label for c in pick.ties] == ["d1 b128 fp32 eager w1 ddp"]


def test_failures_with_reasons_refusals_and_the_largest_batch_that_fit():
    rows = [
        row(1, 256, throughput=1000.0),
        {
            **row(1, 512),
            "status": "oom",
            "error": "oom: CUDA out of memory\ntraceback...",
            "throughput": None,
        },
        {**row(1, 1024), "status": "oom", "error": "oom: again", "throughput": None},
        {
            **row(2, 256),
            "status": "failed",
            "error": "failed: RuntimeError: boom\n  File x",
            "throughput": None,
        },
        {
            **row(2, 256),
            "repeat": 1,
            "status": "failed",
            "error": "failed: RuntimeError: boom",
            "throughput": None,
        },
        {
            **row(1, 256, precision="bf16"),
            "status": "diverged",
            "error": "non-finite training loss",
        },
    ]
    rep = _report(
        rows, refused=[("d1 b256 tf32 eager w1 ddp", "tf32 is a CUDA tensor-core math mode")]
    )
    got = {(f.label, f.status): (f.reason, f.count) for f in rep.failures}
    assert got[("d1 b512 fp32 eager w1 ddp", "oom")] == ("oom: CUDA out of memory", 1)
    assert got[("d2 b256 fp32 eager w1 ddp", "failed")] == ("failed: RuntimeError: boom", 2)
    assert got[("d1 b256 bf16 eager w1 ddp", "diverged")][0] == "non-finite training loss"
    assert got[("d1 b256 tf32 eager w1 ddp", "refused")][0].startswith("tf32")
    limits = {(b.precision, b.sync): b.text for b in rep.batch_limits}
    assert limits[("fp32", "ddp")] == (
        "fp32 ddp: largest batch that fit 256/device; 512/device ran out of memory"
    )
    (d,) = rep.diagnoses
    assert any(a.startswith("memory: batch 512 ran out of memory") for a in d.also)


def test_thresholds_are_stated():
    text = " ".join(THRESHOLD_TEXT)
    for needle in ("20%", "5%", "15%", "50%", "90%", "0.5 points"):
        assert needle in text


def test_compile_against_its_eager_twin_with_the_break_even_point():
    rows = [
        row(1, throughput=1000.0, compile_s=0.0),  # 0.128 s per step
        row(1, throughput=1280.0, compile="inductor", compile_s=14.0),  # 0.100 s per step
        row(1, 256, throughput=1000.0),
        row(1, 256, throughput=900.0, compile="inductor", compile_s=20.0),
    ]
    notes = _report(rows).compile_notes
    assert notes == [
        "d1 b128 fp32 inductor w1 ddp: 1.28x eager, pays for itself after 500 steps; "
        "one-time compile cost 14.0 s",
        "d1 b256 fp32 inductor w1 ddp: 0.90x eager: slower, keep eager; "
        "one-time compile cost 20.0 s",
    ]


def test_repeats_that_disagree_over_short_windows_are_called_too_short_to_rank_on():
    """Two repeats 30% apart over 0.1 s windows: the report says to raise train.steps; the
    same disagreement over 5 s windows, or close repeats over short ones, it does not."""
    from report_rows import row

    from amdahl.report import report_from_rows

    def notes(throughputs, steps):
        rows = [row(1, 64, "none", t, repeat=i, steps=steps) for i, t in enumerate(throughputs)]
        return [n for n in report_from_rows(rows).notes if "too short to rank on" in n]

    # 64 samples at ~1e4 samples/s: 6.4 ms a step, 16 steps ~0.1 s, 800 steps ~5 s
    (note,) = notes([10_000.0, 13_000.0], steps=16)
    assert "1 configuration(s)" in note and "raise train.steps" in note and "CV 18%" in note
    assert notes([10_000.0, 13_000.0], steps=800) == []
    assert notes([10_000.0, 10_200.0], steps=16) == []
    assert notes([10_000.0], steps=16) == []  # one repeat: no spread to judge
