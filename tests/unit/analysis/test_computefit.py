"""The step-time model's compute term and its failed-fit rule (analysis/computefit.py,
stepmodel.py), and the speedup baseline (analysis/scaling.py, the report, `platform predict`):

- on synthetic trials with known terms (a sync-none line per device count, a DDP wrapper cost on
  one device, theta and gamma) the fit recovers every term; on a committed measured sweep
  (tests/data/heldout) leave-one-out predicts every multi-device configuration;
- a fit forced onto a bound (theta, a fallback kappa, a compute intercept) is named, with its
  bound and meaning, and the predictions that use it are withheld;
- the report and `platform predict` say which 1-device run the speedup divides by, and show the
  speedup against the run without a wrapper where the two differ beyond the spread."""

from pathlib import Path

import pytest
from click.testing import CliRunner
from report_rows import ALPHA, BANDWIDTH, CALIBRATION, GRAD, conform, row, write_sweep

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import Link, comm_volume
from amdahl.analysis.computefit import fit_line
from amdahl.analysis.configs import group_configs
from amdahl.analysis.prediction import predict_inputs
from amdahl.analysis.scaling import scaling_curves
from amdahl.analysis.selfcheck import error_summary, leave_one_out
from amdahl.analysis.stepmodel import ModelInputs, combine, fit
from amdahl.cli.commands import main
from amdahl.report import write_reports
from amdahl.spec.schema import OptionsSpec

LINK = Link(ALPHA, BANDWIDTH, "intra-node")
#: GRAD in four 1-MiB DDP buckets: DDP can overlap them with the backward, so gamma is free (one
#: bucket would fix it at 1: comm.no_overlap).
BUCKETS = OptionsSpec(bucket_cap_mb=1)
#: Compute per device count: p -> (a_p, b_p). Contention grows the slope more than the intercept
#: (memory bandwidth), so no single factor kappa describes it.
LINES = {1: (2e-3, 5e-5), 2: (2.2e-3, 6.5e-5), 4: (2.6e-3, 8e-5)}
WRAPPER = 1.5e-3  # the DDP wrapper's seconds per step, on one device and on more
WAIT = 1e-3


def trials(theta=1.6, gamma=2.0, wrapper=WRAPPER, lines=LINES, batches=(32, 64, 128, 256)):
    """Rows the documented model generates: sync none runs the bare line; ddp adds the wrapper
    and, on more than one device, theta x the calibrated ring combined with exponent gamma."""
    rows = []
    for sync in ("none", "ddp"):
        for p, (a, b) in lines.items():
            for bs in batches:
                compute = a + b * bs + (wrapper if sync == "ddp" else 0.0)
                comm = comm_volume(sync, p, GRAD, BUCKETS).seconds(LINK) * theta
                wall = combine(compute, comm, gamma) + WAIT
                rows.append(row(p, bs, sync, bs * p / wall, wall=wall, data_wait_s=WAIT))
    return conform(rows)


def inputs(rows, calibration=CALIBRATION):
    cal = Calibration.from_dict(calibration) if calibration else None
    return ModelInputs(group_configs(rows), cal, BUCKETS)


def family(model, sync):
    return next(f for f in model.families.values() if f.sync == sync)


# --------------------------------------------------------------------------- recovery


def test_fit_recovers_the_compute_lines_the_wrapper_theta_and_gamma():
    model = fit(inputs(trials()))
    ddp, none = family(model, "ddp"), family(model, "none")
    for fam in (ddp, none):
        assert (fam.a_c, fam.b_c) == (pytest.approx(2e-3, rel=1e-6), pytest.approx(5e-5, rel=1e-6))
        for p in (2, 4):
            assert fam.lines[p] == (
                pytest.approx(LINES[p][0], rel=1e-6),
                pytest.approx(LINES[p][1], rel=1e-6),
            )
        assert not fam.hits
    # the wrapper is apart from compute: ddp's 1-device trials are 1.5 ms slower than none's
    assert ddp.wrapper_s == pytest.approx(WRAPPER, rel=1e-6)
    assert none.wrapper_s == 0.0
    assert "sync none" in ddp.compute_source and "1-device ddp" in ddp.wrapper_source
    # theta's small prior (stepmodel.THETA_PRIOR) pulls it a few percent towards 1 where gamma
    # and theta trade off
    assert ddp.theta == pytest.approx(1.6, rel=0.05)
    assert ddp.gamma == pytest.approx(2.0, rel=0.05)
    # kappa is reported, measured at the largest p: line(4) / line(1) at the median batch
    assert none.kappa == pytest.approx((2.6e-3 + 8e-5 * 128) / (2e-3 + 5e-5 * 128), rel=1e-6)


def test_leave_one_out_predicts_every_measured_multi_device_configuration():
    """On a committed fit sweep (tests/data/heldout: ddp, ddp_fp16 and none measured at 1, 2
    and 4 devices, batch 32 and 128): every multi-device configuration is left out and
    predicted, none as a failed fit. How close they come is held in test_heldout_accuracy.py,
    on a truth sweep measured apart from the fit."""
    from amdahl.report.predict import load_model_inputs

    measured = load_model_inputs(Path(__file__).resolve().parents[2] / "data/heldout/sim-a/fit")
    multi = [c for c in measured.configs if c.ok and c.devices > 1]
    loo = leave_one_out(measured)
    assert len(loo) == len(multi) == 3 * 2 * 2  # three strategies x p in 2, 4 x two batches
    assert error_summary(loo)[2] == len(loo)
    assert all(p.predicted and not p.failed_fit for p in loo)


def test_an_unmeasured_device_count_uses_the_nearest_measured_below_and_says_so():
    model = fit(inputs(trials()))
    ddp = family(model, "ddp")
    assert ddp.compute_s(64.0, 8) == pytest.approx(2.6e-3 + 8e-5 * 64 + WRAPPER)
    pred = model.predict(ddp, 8, 64.0)
    assert any("taken as measured at 4" in c for c in pred.caveats)
    assert not model.predict(ddp, 4, 64.0).caveats


# --------------------------------------------------------------------------- failed fits


def test_theta_forced_onto_its_bound_is_a_failed_fit_and_its_predictions_are_withheld():
    model = fit(inputs(trials(theta=60.0, gamma=1.0)))
    ddp = family(model, "ddp")
    assert [h.parameter for h in ddp.hits] == ["theta"]
    hit = ddp.hits[0]
    assert (hit.bound, hit.side, hit.scope) == (16.0, "upper", "communication")
    assert "16x the calibrated collective" in hit.text()
    withheld = model.predict(ddp, 4, 64.0)
    assert withheld.throughput is None and withheld.unknown.startswith("withheld, failed fit")
    assert "theta" in withheld.unknown
    flagged = model.predict(ddp, 4, 64.0, withhold=False)
    assert flagged.throughput and any(c.startswith("FAILED FIT") for c in flagged.caveats)
    # one device does not communicate: theta is not used, nothing withheld
    assert model.predict(ddp, 1, 64.0).throughput
    assert not family(model, "none").hits
    # leave-one-out counts the failures instead of dropping them
    loo = leave_one_out(inputs(trials(theta=60.0, gamma=1.0)))
    assert any(p.failed_fit and p.error is not None for p in loo)


def test_a_fallback_kappa_on_its_bound_is_a_failed_fit():
    # ddp alone (no sync none to measure compute): its 2-device compute comes from
    # step - comm_s, and a comm_s that overstates the communication puts compute at 2 devices
    # at a fifth of 1 device's, which kappa cannot reach: the kappa = 0.25
    rows = [
        row(1, 64, "ddp", 64 / 0.011, wall=0.011, data_wait_s=0.001),
        row(1, 256, "ddp", 256 / 0.031, wall=0.031, data_wait_s=0.001),
        row(2, 64, "ddp", 128 / 0.016, wall=0.016, data_wait_s=0.001, comm_s=0.013),
        row(2, 256, "ddp", 512 / 0.040, wall=0.040, data_wait_s=0.001, comm_s=0.033),
    ]
    ddp = next(iter(fit(inputs(conform(rows))).families.values()))
    assert [(h.parameter, h.bound, h.side) for h in ddp.hits] == [("kappa", 0.25, "lower")]
    assert "cannot be" in ddp.hits[0].meaning
    assert "inside compute" in ddp.wrapper_source


def test_a_compute_intercept_forced_to_zero_is_a_failed_fit_borrowed_by_every_strategy():
    # compute grows as b^2: the line through the batches would start well below zero
    rows = []
    for sync in ("none", "ddp"):
        for bs in (32, 64, 128, 256):
            wall = 1e-7 * bs * bs + 1e-4 + WAIT
            rows.append(row(1, bs, sync, bs / wall, wall=wall, data_wait_s=WAIT))
    model = fit(inputs(conform(rows)))
    none, ddp = family(model, "none"), family(model, "ddp")
    assert [(h.parameter, h.bound, h.side) for h in none.hits] == [("a_c", 0.0, "lower")]
    assert ddp.hits and ddp.hits[0].where == "sync none's"
    assert model.predict(none, 1, 64.0).unknown.startswith("withheld")
    assert model.predict(ddp, 2, 64.0).unknown.startswith("withheld")


def test_a_line_within_noise_of_the_origin_is_not_a_failed_fit():
    # the unconstrained intercept is -0.5% of the smallest point: timer noise, clamped quietly
    line = fit_line([10.0, 20.0], [0.995e-3, 2.0e-3])
    assert line.a == 0.0 and not line.hits
    line = fit_line([10.0, 20.0], [0.9e-3, 2.0e-3])
    assert line.a == 0.0 and [h.parameter for h in line.hits] == ["a_c"]


def test_cli_predict_and_the_report_name_the_failed_fit(tmp_path):
    d = write_sweep(tmp_path / "s", trials(theta=60.0, gamma=1.0), CALIBRATION)
    wide = CliRunner(env={"COLUMNS": "250"})
    out = wide.invoke(main, ["predict", str(d), "--devices", "4,8"]).output
    assert "FAILED FIT, fp32 eager w1 ddp: theta = 16 at its upper bound 16" in out
    assert "withheld, failed fit" in out
    md = write_reports(d)["markdown"].read_text()
    section = md[md.index("## Predicted vs measured") :]
    assert "FAILED FIT, fp32 eager w1 ddp: theta" in section
    assert "FAILED FIT (withheld in predictions)" in section  # the leave-one-out table


# --------------------------------------------------------------------------- the baseline


def _baseline_rows(none_d1: float, spread: float = 10.0) -> list[dict]:
    """Three repeats each: ddp at 1 and 2 devices, sync none at 1 and 2 devices."""
    rows = []
    for repeat, delta in enumerate((-spread, 0.0, spread)):
        rows += [
            row(1, 128, "ddp", 1000.0 + delta, repeat=repeat),
            row(2, 128, "ddp", 1700.0 + delta, repeat=repeat),
            row(1, 128, "none", none_d1 + delta, repeat=repeat),
            row(2, 128, "none", 2100.0 + delta, repeat=repeat),
        ]
    return conform(rows)


def test_the_curve_carries_the_unwrapped_baseline_only_beyond_the_spread():
    ddp = next(c for c in scaling_curves(group_configs(_baseline_rows(1150.0))) if c.sync == "ddp")
    assert ddp.unwrapped is not None and ddp.unwrapped.sync == "none"
    assert ddp.points[1].speedup.median == pytest.approx(1.7)
    assert ddp.points[1].speedup_unwrapped.median == pytest.approx(1700 / 1150)
    assert "inside the ddp wrapper" in ddp.baseline_text
    close = scaling_curves(group_configs(_baseline_rows(1015.0)))  # within the 2% spread
    assert all(c.unwrapped is None for c in close)


def test_report_says_which_one_device_run_the_speedup_divides_by(tmp_path):
    md = write_reports(write_sweep(tmp_path / "a", _baseline_rows(1150.0)))["markdown"]
    text = md.read_text()
    assert "speedup divides by the 1-device ddp run (inside the ddp wrapper" in text
    assert "without a wrapper (sync none) is 15.0% faster than the 1-device ddp run" in text
    assert "speedup vs 1 device, no wrapper" in text
    assert "1.48x" in text  # 1700 / 1150 at p = 2
    close = write_reports(write_sweep(tmp_path / "b", _baseline_rows(1015.0)))["markdown"]
    text = close.read_text()
    assert "speedup divides by the 1-device ddp run" in text
    assert "speedup vs 1 device, no wrapper" not in text


def test_predict_shows_the_speedup_against_the_run_without_a_wrapper(tmp_path):
    rows = _baseline_rows(1150.0)
    result = predict_inputs(inputs(rows, calibration=None), [1, 2])
    ddp = next(f for f in result.families if f.family.sync == "ddp")
    assert all(r.unwrapped == pytest.approx(1150.0) for r in ddp.rows)
    none = next(f for f in result.families if f.family.sync == "none")
    assert all(r.unwrapped is None for r in none.rows)
    d = write_sweep(tmp_path / "s", rows, CALIBRATION)
    out = CliRunner(env={"COLUMNS": "250"}).invoke(main, ["predict", str(d), "--devices", "4"])
    assert out.exit_code == 0, out.output
    assert "no wrapper" in out.output and "inside its wrapper" in out.output
