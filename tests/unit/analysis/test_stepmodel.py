"""The step-time model (analysis/comm.py, stepmodel.py, prediction.py): communication volume of
every sync strategy against hand-computed bytes, the fit recovering the terms it generated,
leave-one-out on noisy data, and `platform predict` and the report's "Predicted vs measured"
section on a sweep directory."""

import json
import random
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_rows import (
    ALPHA,
    BANDWIDTH,
    CALIBRATION,
    PARAMS,
    conform,
    row,
    scaling_rows,
    write_sweep,
)

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import Link, comm_volume, options_from_mapping
from amdahl.analysis.configs import group_configs
from amdahl.analysis.prediction import predict_inputs
from amdahl.analysis.selfcheck import error_summary, leave_one_out
from amdahl.analysis.stepmodel import ModelInputs, combine, fit
from amdahl.cli.commands import main
from amdahl.report import write_reports
from amdahl.spec.schema import OptionsSpec

MiB = 2**20
#: A committed held-out set (tests/data/heldout/ledger.yaml): rows measured, not generated here.
HELDOUT = Path(__file__).resolve().parents[2] / "data" / "heldout" / "sim-a"
G = 8 * MiB  # gradient bytes: one DDP bucket at the default 25 MB cap
OPTIONS = OptionsSpec(powersgd_rank=2, local_sgd_every=4, ps_shards=2, accumulate_steps=4)
#: The synthetic sweeps' 4e6 gradient bytes in four 1-MiB DDP buckets: DDP can overlap them
#: with the backward, so gamma is free (one bucket would fix it at 1: comm.no_overlap).
BUCKETS = OptionsSpec(bucket_cap_mb=1)


# --------------------------------------------------------------------------- volumes by hand


#: Bytes per optimizer step of each strategy, by hand, per device count (PowerSGD's depend on
#: the parameters' shapes: test_powersgd_sends_rank_r_factors_of_each_matrix_from_its_shapes).
BY_HAND = {
    # ring all-reduce 2(p-1)/p x G: 1, 1.5, 1.75 G
    "ddp": {2: 1.0 * G, 4: 1.5 * G, 8: 1.75 * G},
    "accumulate": {2: 1.0 * G, 4: 1.5 * G, 8: 1.75 * G},  # once per optimizer step
    "ddp_fp16": {2: 0.5 * G, 4: 0.75 * G, 8: 0.875 * G},
    "ddp_bf16": {2: 0.5 * G, 4: 0.75 * G, 8: 0.875 * G},
    # all-reduce + partition broadcasts: 3(p-1)/p x G
    "zero1": {2: 1.5 * G, 4: 2.25 * G, 8: 2.625 * G},
    # all-gather x2 + reduce-scatter: 3(p-1)/p x G
    "fsdp": {2: 1.5 * G, 4: 2.25 * G, 8: 2.625 * G},
    # push + pull through 2 shards: 2 G max(1, p/2)
    "param_server": {1: 2.0 * G, 2: 2.0 * G, 4: 4.0 * G, 8: 8.0 * G},
    # parameter all-reduce every 4 steps: 2(p-1)/p x G / 4
    "local_sgd": {2: 0.25 * G, 4: 0.375 * G, 8: 0.4375 * G},
    "none": {2: 0.0, 4: 0.0, 8: 0.0},
}
FROM_SHAPES = {"powersgd"}


@pytest.mark.parametrize(("sync", "by_p"), list(BY_HAND.items()))
def test_bytes_per_step_of_each_strategy(sync, by_p):
    for p, expected in by_p.items():
        v = comm_volume(sync, p, G, OPTIONS)
        assert v.bytes == pytest.approx(expected), (sync, p)
        assert not v.estimate


def test_every_strategy_of_the_sweep_schema_has_a_communication_model():
    """A strategy added to the schema must bring its bytes, checked by hand above: the model
    would otherwise predict it with whatever comm_volume falls back to."""
    from typing import get_args

    from amdahl.spec.schema import Sync

    assert set(get_args(Sync)) == set(BY_HAND) | FROM_SHAPES


@pytest.mark.parametrize("p", [2, 4, 8])
def test_latency_terms_count_ring_steps_per_collective_and_bucket(p):
    assert comm_volume("ddp", p, G, OPTIONS).latency_steps == 2 * (p - 1)
    # 60 MiB over 25 MiB buckets: 3 all-reduces
    assert comm_volume("ddp", p, 60 * MiB, OPTIONS).latency_steps == 3 * 2 * (p - 1)
    assert comm_volume("powersgd", p, G, OPTIONS).latency_steps == 3 * 2 * (p - 1)
    assert comm_volume("fsdp", p, G, OPTIONS).latency_steps == 3 * (p - 1)
    assert comm_volume("local_sgd", p, G, OPTIONS).latency_steps == 2 * (p - 1) / 4
    v = comm_volume("ddp", p, G, OPTIONS)
    link = Link(ALPHA, BANDWIDTH, "intra-node")
    assert v.seconds(link) == pytest.approx(2 * (p - 1) * ALPHA + 2 * (p - 1) / p * G / BANDWIDTH)


def test_one_device_moves_nothing_except_through_a_parameter_server():
    for sync in ("ddp", "ddp_fp16", "powersgd", "zero1", "fsdp", "local_sgd", "accumulate"):
        assert comm_volume(sync, 1, G, OPTIONS).bytes == 0.0
    assert comm_volume("param_server", 1, G, OPTIONS).bytes == 2 * G
    assert comm_volume("bogus", 2, G, OPTIONS) is None


@pytest.mark.parametrize("p", [2, 4, 8])
def test_powersgd_sends_rank_r_factors_of_each_matrix_from_its_shapes(p):
    # rank 2: 256x512 travels as (256 + 512) x 2 = 1536 values (3072 < 131072: compressed);
    # the bias (1-D) whole; 2x256 whole, since (2 + 256) x 2 x 2 = 1032 >= 512
    shapes = [[256, 512], [256], [2, 256]]
    total = 256 * 512 + 256 + 2 * 256
    sent = 1536 + 256 + 512
    v = comm_volume("powersgd", p, total * 4, OPTIONS, shapes)
    assert v.bytes == pytest.approx(2 * (p - 1) / p * sent * 4)
    assert {2: 9216, 4: 13824, 8: 16128}[p] == pytest.approx(v.bytes)
    assert not v.estimate


def test_powersgd_without_shapes_is_a_labelled_square_matrix_estimate():
    n = 2**20  # elements: one 1024 x 1024 matrix, rank 2 -> (1024 + 1024) x 2 = 4096 values
    v = comm_volume("powersgd", 2, n * 4, OPTIONS)
    assert v.bytes == pytest.approx(4096 * 4)
    assert "no parameter shapes" in v.estimate


def test_options_from_a_spec_mapping_take_defaults_where_absent_or_odd():
    default = OptionsSpec()
    for spec in (None, {}, {"options": None}, {"options": [1]}, "text"):
        assert options_from_mapping(spec) == default
    odd = {"powersgd_rank": 2.7, "bucket_cap_mb": 3, "ps_shards": True, "local_sgd_every": -1}
    options = options_from_mapping({"options": {**odd, "accumulate_steps": "x"}})
    assert (options.powersgd_rank, options.bucket_cap_mb) == (2, 3.0)  # to the default's type
    assert options.ps_shards == default.ps_shards
    assert options.local_sgd_every == default.local_sgd_every
    assert options.accumulate_steps == default.accumulate_steps


def test_calibrations_parameter_shapes_reach_the_powersgd_volume():
    shapes = [[256, 512], [256]]
    cal = {**CALIBRATION, "param_shapes_by_params": {PARAMS: shapes, "{}": "not shapes"}}
    assert Calibration.from_dict(cal).shapes_for(PARAMS) == shapes
    assert Calibration.from_dict(cal).shapes_for("{}") is None
    only = {**CALIBRATION, "param_shapes_by_params": {"other": shapes}}
    assert Calibration.from_dict(only).shapes_for(PARAMS) == shapes  # the single entry
    model = fit(_inputs(synthetic(syncs=("powersgd", "none")), cal))
    powersgd = next(f for f in model.families.values() if f.sync == "powersgd")
    assert powersgd.shapes == shapes
    assert not model.predict(powersgd, 4, 64.0).volume.estimate


def test_combine_adds_at_gamma_1_and_tends_to_the_larger_term():
    assert combine(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert combine(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert combine(3.0, 4.0, 8.0) < 4.2
    assert combine(3.0, 0.0, 2.0) == pytest.approx(3.0)


# --------------------------------------------------------------------------- fitting


def synthetic(
    a=2e-3,
    b=5e-5,
    gamma=2.5,
    kappa=1.0,
    theta=1.0,
    wait=1e-3,
    syncs=("ddp", "none"),
    devices=(1, 2, 4, 8),
    batches=(32, 64, 128, 256),
    noise=0.0,
    seed=0,
):
    """Rows the model itself generates (4e6 gradient bytes, ALPHA and BANDWIDTH)."""
    rng = random.Random(seed)
    link = Link(ALPHA, BANDWIDTH, "intra-node")
    rows = []
    for sync in syncs:
        for p in devices:
            for bs in batches:
                tc = (a + b * bs) * (kappa if p > 1 else 1.0)
                tn = comm_volume(sync, p, 4e6, BUCKETS).seconds(link) * theta
                busy = combine(tc, tn, gamma) * (1 + rng.uniform(-noise, noise))
                wall = busy + wait
                rows.append(row(p, bs, sync, bs * p / wall, wall=wall, data_wait_s=wait))
    return conform(rows)


def _inputs(rows, calibration=CALIBRATION):
    cal = Calibration.from_dict(calibration) if calibration else None
    return ModelInputs(group_configs(rows), cal, BUCKETS)


def test_fit_recovers_compute_line_contention_and_overlap_exponent():
    model = fit(_inputs(synthetic(kappa=1.25)))
    ddp = next(f for f in model.families.values() if f.sync == "ddp")
    none = next(f for f in model.families.values() if f.sync == "none")
    for fam in (ddp, none):
        assert fam.a_c == pytest.approx(2e-3, rel=1e-3)
        assert fam.b_c == pytest.approx(5e-5, rel=1e-3)
    # ddp's multi-device trials carry no comm_s, so its contention comes from sync none's
    assert none.kappa == pytest.approx(1.25, rel=1e-3)
    assert ddp.kappa == pytest.approx(1.25, rel=1e-3) and "sync none" in ddp.kappa_source
    assert ddp.gamma == pytest.approx(2.5, rel=1e-2)
    assert ddp.theta == pytest.approx(1.0, rel=1e-2)
    assert ddp.data_wait_s(64) == (pytest.approx(1e-3), "measured at this batch")
    pred = model.predict(ddp, 32, 128.0)
    tc = (2e-3 + 5e-5 * 128) * 1.25
    tn = comm_volume("ddp", 32, 4e6, BUCKETS).seconds(Link(ALPHA, BANDWIDTH, "intra-node"))
    assert pred.throughput == pytest.approx(128 * 32 / (combine(tc, tn, 2.5) + 1e-3), rel=1e-2)


def test_fit_recovers_a_strategy_that_communicates_slower_than_the_calibrated_ring():
    # theta 1.6: the strategy's communication costs 1.6x the calibrated collective (work the
    # wire formula does not see); gamma 1 (no overlap) could never fit that from below
    model = fit(_inputs(synthetic(gamma=1.0, theta=1.6)))
    ddp = next(f for f in model.families.values() if f.sync == "ddp")
    assert ddp.theta == pytest.approx(1.6, rel=0.02)
    assert ddp.gamma == pytest.approx(1.0, abs=0.05)
    assert "theta" in ddp.gamma_source
    exact = leave_one_out(_inputs(synthetic(gamma=1.0, theta=1.6)))
    assert max(abs(p.error) for p in exact) < 0.01


def test_compute_observed_through_comm_s_on_multi_device_trials():
    # ddp on 2 devices only: compute = step - data wait - exposed comm
    rows = [
        row(1, 64, "ddp", 64 / 0.011, wall=0.011, data_wait_s=0.001),
        row(1, 256, "ddp", 256 / 0.031, wall=0.031, data_wait_s=0.001),
        row(2, 64, "ddp", 128 / 0.016, wall=0.016, data_wait_s=0.001, comm_s=0.003),
        row(2, 256, "ddp", 512 / 0.040, wall=0.040, data_wait_s=0.001, comm_s=0.003),
    ]
    fam = next(iter(fit(_inputs(conform(rows))).families.values()))
    # 1 device: 0.010 at 64, 0.030 at 256; 2 devices: 0.012 and 0.036 = 1.2 x the same line
    assert fam.compute_points == 4
    assert fam.a_c == pytest.approx(0.010 - 64 * 0.02 / 192, rel=1e-3)
    assert fam.b_c == pytest.approx(0.02 / 192, rel=1e-3)
    assert fam.kappa == pytest.approx(1.2, rel=1e-3)


def test_leave_one_out_on_noisy_data_predicts_each_multi_device_point():
    inputs = _inputs(synthetic(noise=0.04, seed=3))
    loo = leave_one_out(inputs)
    assert len(loo) == 2 * 3 * 4  # two strategies x p in 2, 4, 8 x four batches
    assert all(p.config.devices > 1 and p.predicted for p in loo)
    assert error_summary(loo)[2] == 24  # how close they are is held on measured rows:
    # test_heldout_accuracy.py; rows this model's own form generated recover it exactly
    exact = leave_one_out(_inputs(synthetic()))
    assert max(abs(p.error) for p in exact) < 1e-3


def test_without_calibration_only_sync_none_is_predicted():
    inputs = _inputs(synthetic(), calibration=None)
    result = predict_inputs(inputs, [16])
    by_sync = {f.family.sync: f for f in result.families}
    assert by_sync["none"].rows[0].prediction.throughput
    ddp = by_sync["ddp"].rows[0].prediction
    assert ddp.throughput is None and "no communication model" in ddp.unknown
    assert any("no communication model" in n for n in result.notes)


def test_a_family_without_compute_borrows_sync_nones():
    rows = synthetic(syncs=("none",)) + synthetic(syncs=("local_sgd",), devices=(2,))
    model = fit(_inputs(rows))
    local = next(f for f in model.families.values() if f.sync == "local_sgd")
    assert "borrowed from sync none" in local.compute_source
    assert local.b_c == pytest.approx(5e-5, rel=1e-3)


def test_inter_node_terms_are_used_when_a_prediction_spans_nodes():
    inter = {"inter_node_alpha_s": 1e-4, "inter_node_bandwidth_Bps": 1e8}
    inputs = _inputs(synthetic(), {**CALIBRATION, **inter})
    model = fit(inputs)
    ddp = next(f for f in model.families.values() if f.sync == "ddp")
    one, two = model.predict(ddp, 16, 64.0, 1), model.predict(ddp, 16, 64.0, 2)
    assert one.link.scope == "intra-node" and two.link.scope == "inter-node"
    assert two.comm_s > one.comm_s
    inputs.calibration = Calibration.from_dict(CALIBRATION)
    alone = fit(inputs).predict(ddp, 16, 64.0, 2)
    assert any("no inter-node" in c for c in alone.caveats)


# --------------------------------------------------------------------------- CLI and report


def _sweep(tmp_path, calibration=CALIBRATION):
    rows = scaling_rows() + [
        row(1, 512, "ddp", 3000.0, phases=(0.001, 0.04, 0.08, 0.007)),
        row(2, 512, "ddp", 5000.0, phases=(0.001, 0.04, 0.11, 0.007)),
        row(1, 512, "none", 3000.0, phases=(0.001, 0.04, 0.08, 0.007)),
        row(2, 512, "none", 5600.0, phases=(0.001, 0.04, 0.08, 0.007)),
    ]
    spec = {"report": {"cost_per_device_hour": 2.0}, "options": {"bucket_cap_mb": 25}}
    return write_sweep(tmp_path / "s", rows, calibration, spec)


def test_cli_predict_labels_every_figure_and_states_its_terms(tmp_path):
    d = _sweep(tmp_path)
    wide = CliRunner(env={"COLUMNS": "200"})  # rich wraps headers in a narrow terminal
    result = wide.invoke(main, ["predict", str(d), "--devices", "16,32,64"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "PREDICTION" in out and "not measured" in out
    assert "predicted samples/s" in out and "predicted speedup" in out
    assert "predicted $/M samples" in out and "predicted ms per optimizer step" in out
    assert "a_c" in out and "b_c" in out and "gamma" in out and "alpha" in out
    assert "leave-one-out check: median" in out.lower()
    assert "w1 ddp" in out and "w1 none" in out
    assert all(f"│      {p} │" in out for p in (16, 32, 64))
    assert "sync none is the no-communication ceiling" in out


def test_cli_predict_batch_and_nodes(tmp_path):
    d = _sweep(tmp_path)
    result = CliRunner().invoke(
        main, ["predict", str(d), "--devices", "8", "--batch-size", "1024", "--nodes", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "1024" in result.output
    assert "no inter-node" in result.output


def test_cli_predict_without_calibration_says_so_and_exits_0(tmp_path):
    d = _sweep(tmp_path, calibration=None)
    result = CliRunner().invoke(main, ["predict", str(d), "--devices", "16"])
    assert result.exit_code == 0, result.output
    assert "no communication model" in result.output


def test_cli_predict_bad_input_is_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["predict", str(tmp_path / "nope"), "--devices", "16"])
    assert result.exit_code == 2 and "not a sweep directory" in result.output
    d = _sweep(tmp_path)
    result = CliRunner().invoke(main, ["predict", str(d), "--devices", "16,x"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_report_has_predicted_vs_measured_and_the_models_projection(tmp_path):
    d = _sweep(tmp_path)
    calibration = json.loads((d / "calibration.json").read_text())
    assert calibration["grad_bytes_by_params"]
    md = write_reports(d)["markdown"].read_text()
    section = md[md.index("## Predicted vs measured") :]
    section = section[: section.index("\n## ")]
    assert "leave-one-out" in section
    assert "| d2 b128 fp32 eager w1 ddp |" in section
    assert "PREDICTION" in section and "Amdahl" in section
    assert "descriptive" in md  # the Amdahl projection is labelled as such
    html = (d / "report.html").read_text()
    assert 'data-plot="predicted"' in html


def test_leave_one_out_leaves_out_the_sync_none_twin_too():
    """Compute at the left-out point must be predicted: with the `sync: none` twin at the same
    devices and batch left in, the refit would read that point's compute off the twin."""
    rows = [
        row(1, 64, "none", 64 / 0.010, wall=0.010),
        row(1, 256, "none", 256 / 0.030, wall=0.030),
        row(1, 64, "ddp", 64 / 0.010, wall=0.010),
        row(1, 256, "ddp", 256 / 0.030, wall=0.030),
        # 2 devices: contention makes compute 1.5x the 1-device line, seen only at batch 64
        row(2, 64, "none", 128 / 0.015, wall=0.015),
        row(2, 64, "ddp", 128 / 0.018, wall=0.018, comm_s=0.003),
    ]
    loo = {(p.config.devices, p.config.sync): p for p in leave_one_out(_inputs(conform(rows)))}
    ddp = loo[(2, "ddp")]
    # Without the twin, nothing at 2 devices shows the contention: the prediction is faster
    # than measured. With it, compute at 2 devices would come out exact and the error tiny.
    assert ddp.predicted is not None and ddp.error > 0.2


def test_a_one_device_point_whose_refit_has_one_batch_left_says_what_it_checks():
    """Left out with its twin, a 1-device point at one of two batches leaves its 1-device
    compute line one batch: the refit takes it proportional to the batch, so the row's error
    checks that fallback (the report's leave-one-out table says so); with three batches, or at
    2 devices, the refit keeps a line and the row says nothing."""

    def loo_of(batches):
        rows = []
        for b in batches:
            rows += [row(1, b, "none", b / (0.004 + 1e-4 * b))]
            rows += [row(1, b, "ddp", b / (0.005 + 1e-4 * b))]
            rows += [row(2, b, s, 2 * b / (0.006 + 1e-4 * b)) for s in ("none", "ddp")]
        loo = leave_one_out(_inputs(conform(rows)), min_devices=1)
        return {(p.config.devices, p.config.batch_size, p.config.sync): p for p in loo}

    two = loo_of((64, 256))
    for sync in ("none", "ddp"):
        assert "one batch only" in two[(1, 64, sync)].note
        assert two[(2, 64, sync)].note == ""
    three = loo_of((64, 128, 256))
    assert all(pt.note == "" for pt in three.values())


def test_cli_predict_json_carries_every_prediction_with_its_terms_and_caveats(tmp_path):
    d = _sweep(tmp_path)
    result = CliRunner().invoke(main, ["predict", str(d), "--devices", "4,16", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    from amdahl.report.predict import load_model_inputs

    api = predict_inputs(load_model_inputs(d), [4, 16])
    assert out["calibration"]["alpha_s"] == pytest.approx(CALIBRATION["alpha_s"])
    assert out["calibration"]["calibrated_devices"] == CALIBRATION["devices"]
    assert out["calibration"]["oversubscribed"] is None  # nothing calibrated above the cores
    assert out["leave_one_out"]["points"] == api.errors[2]
    assert [f["label"] for f in out["families"]] == [f.family.label for f in api.families]
    for fam, expected in zip(out["families"], api.families, strict=True):
        assert fam["measured_devices"] == [1, 2, 4]  # scaling_rows: 1, 2 and 4 devices
        assert [p["devices"] for p in fam["predictions"]] == [r.devices for r in expected.rows]
        for p, r in zip(fam["predictions"], expected.rows, strict=True):
            assert p["throughput"] == pytest.approx(r.prediction.throughput)
            assert p["caveats"] == list(r.prediction.caveats)
        assert set(fam["terms"]) >= {"a_c_s", "b_c_s_per_sample", "gamma", "theta"}


def test_predictions_beyond_every_check_say_how_far_out_and_quote_no_checks_error(tmp_path):
    """16 devices is 4x the widest measured and twice as far as the one check (2 -> 4): its
    caveat names that check and the held-out evidence, never the check's error as its own."""
    from amdahl.report.predict import predict_sweep

    d = _sweep(tmp_path)  # 1, 2 and 4 devices
    result = predict_sweep(d, [4, 16])
    ext = result.extrapolation
    assert (ext.fitted_max, ext.held_out) == (2, 4) and ext.points > 0
    for fam in result.families:
        for row_ in fam.rows:
            beyond = [c for c in row_.prediction.caveats if "the widest measured" in c]
            if row_.devices == 16:
                assert beyond and "4x the widest measured (4)" in beyond[0]
                assert "the farthest check" in beyond[0] and "held-out" in beyond[0]
                assert f"{ext.median:.1%}" not in beyond[0]
            else:
                assert not beyond  # 4 devices were measured
    two = [r for r in scaling_rows() if r["devices"] <= 2]
    unchecked = predict_sweep(write_sweep(tmp_path / "two", two, CALIBRATION), [8])
    assert unchecked.extrapolation is None
    caveats = [c for f in unchecked.families for r in f.rows for c in r.prediction.caveats]
    assert any("not measured" in c and "unchecked" in c for c in caveats)


def test_two_points_at_one_ratio_cannot_separate_gamma_from_theta_and_say_so():
    """One device count and one batch measured twice: any theta has a gamma that fits, so theta
    stays at its prior (the calibrated collective) and the family says why."""
    rows = synthetic(theta=1.6, devices=(1, 2), batches=(64, 64), syncs=("ddp", "none"))
    ddp = next(f for f in fit(_inputs(rows)).families.values() if f.sync == "ddp")
    assert ddp.theta == pytest.approx(1.0)
    assert "not separable" in ddp.gamma_source and "theta fixed at its prior 1" in ddp.gamma_source
    spread = synthetic(theta=1.6, gamma=2.5, devices=(1, 2, 4, 8), batches=(32, 256))
    ddp = next(f for f in fit(_inputs(spread)).families.values() if f.sync == "ddp")
    assert ddp.theta == pytest.approx(1.6, rel=0.05) and "separable" not in ddp.gamma_source


def test_a_gradient_in_one_ddp_bucket_has_no_overlap_and_pins_theta_alone():
    """The same single ratio with 4e6 gradient bytes in one 25-MiB bucket: DDP launches the
    all-reduce only when the backward ends, so gamma is 1, known, and theta is fitted alone
    from the same two points that could not separate the two."""
    rows = synthetic(theta=1.6, gamma=1.0, devices=(1, 2), batches=(64, 64), syncs=("ddp", "none"))
    one_bucket = ModelInputs(group_configs(rows), Calibration.from_dict(CALIBRATION))
    ddp = next(f for f in fit(one_bucket).families.values() if f.sync == "ddp")
    assert ddp.gamma == 1.0 and ddp.theta == pytest.approx(1.6, rel=0.02)
    assert "one DDP bucket" in ddp.gamma_source and "not separable" not in ddp.gamma_source
    from amdahl.analysis.comm import no_overlap

    assert no_overlap("ddp", [4e6], OptionsSpec()).startswith("one DDP bucket")
    assert no_overlap("zero1", [4e6, 2e6], OptionsSpec())  # DDP's reducer under ZeRO too
    assert no_overlap("ddp", [4e6], BUCKETS) == ""  # four buckets: the first overlaps
    assert no_overlap("ddp", [4e6, None], OptionsSpec()) == ""  # a size unknown: not claimed
    assert no_overlap("fsdp", [4e6], OptionsSpec()) == ""  # no DDP reducer
    assert no_overlap("local_sgd", [4e6], OptionsSpec()) == ""


def _calibrated_at_2_and_4(at2: tuple[float, float], at4: tuple[float, float]) -> Calibration:
    """A calibration with (alpha_s, bandwidth_Bps) fits at 2 and 4 devices, the 4's its own."""
    by = {str(p): {"alpha_s": a, "bandwidth_Bps": b} for p, (a, b) in ((2, at2), (4, at4))}
    alpha, bandwidth = at4
    return Calibration.from_dict(
        {
            **CALIBRATION,
            "alpha_s": alpha,
            "bandwidth_Bps": bandwidth,
            "devices": 4,
            "by_devices": by,
        }
    )


def test_a_calibration_at_several_device_counts_says_how_the_collective_grows():
    """alpha and 1/B measured doubling from 2 to 4 devices: at 8 the model takes them doubled
    again (alpha x p^1, 1/B x p^1 on top of the ring), says so beside the prediction, and a
    calibrated count keeps its own fit."""
    from amdahl.analysis.comm import comm_model

    cal = _calibrated_at_2_and_4((1e-5, 1e9), (2e-5, 5e8))
    comm = comm_model(cal)
    assert comm.alpha_exp == pytest.approx(1.0) and comm.bandwidth_exp == pytest.approx(1.0)
    link, _ = comm.link(1, 8)
    assert link.alpha_s == pytest.approx(4e-5) and link.bandwidth_Bps == pytest.approx(2.5e8)
    assert comm.link(1, 2)[0].alpha_s == pytest.approx(1e-5)
    assert "calibrated at 2-4 devices" in comm.growth()
    model = fit(ModelInputs(group_configs(synthetic(devices=(1, 2, 4))), cal, BUCKETS))
    ddp = next(f for f in model.families.values() if f.sync == "ddp")
    caveats = model.predict(ddp, 8, 64.0, withhold=False).caveats
    assert any(c.startswith("communication at 8 devices: calibrated at 2-4") for c in caveats)
    # the way to a measured figure where the cluster is that wide
    assert any("`platform calibrate DIR --devices 8`" in c for c in caveats)
    assert not any("communication at" in c for c in model.predict(ddp, 4, 64.0).caveats)
    # one device count only: the ring as it is, and said
    assert "ring's 2(p-1) steps assumed" in comm_model(Calibration.from_dict(CALIBRATION)).growth()


def test_a_ring_step_never_gets_cheaper_with_more_ranks():
    """gloo at 2-4 ranks on the H200 machine's 16 cores measured alpha falling with p
    (p^-0.35: other algorithms at 2 ranks); extrapolated, 16 ranks' all-reduce came out cheaper
    per ring step than 4's and ddp 100-125% too fast. Growth is fitted at 0 or above."""
    from amdahl.analysis.comm import comm_model

    comm = comm_model(_calibrated_at_2_and_4((2e-4, 1e9), (1e-4, 2e9)))
    assert comm.alpha_exp == 0.0 and comm.bandwidth_exp == 0.0
    link, _ = comm.link(1, 16)
    assert link.alpha_s == pytest.approx(1e-4) and link.bandwidth_Bps == pytest.approx(2e9)


def test_the_calibration_measures_every_small_device_count_and_the_powers_of_two():
    from amdahl.worker.calibration_measurement import sub_counts

    assert sub_counts(1) == [1] and sub_counts(2) == [2]
    assert sub_counts(4) == [2, 3, 4]
    assert sub_counts(8) == [2, 3, 4, 8]
    assert sub_counts(12) == [2, 3, 4, 8, 12]


def test_the_extrapolation_check_narrows_a_calibration_measured_at_several_counts():
    """Calibrated at 2, 4 and 8, swept at 1, 2, 4 and 8: the check refits without 8 and with the
    calibration up to 4 only, so its error is the model's own extrapolation of both."""
    from amdahl.analysis.selfcheck import beyond_measured, extrapolation_check

    by = {str(q): {"alpha_s": 1e-5 * q, "bandwidth_Bps": 2e9 / q} for q in (2, 4, 8)}
    cal = Calibration.from_dict({**CALIBRATION, "devices": 8, "by_devices": by})
    inputs = ModelInputs(group_configs(synthetic(devices=(1, 2, 4, 8))), cal, BUCKETS)
    ext = extrapolation_check(inputs)
    assert (ext.fitted_max, ext.held_out, ext.calibrated_max) == (4, 8, 4)
    assert "extrapolated from a calibration up to 4" in beyond_measured(16, 8, [ext])
    # one calibrated count, at 8: nothing to narrow, and said; at 2: extrapolated, and said
    at8 = Calibration.from_dict({**CALIBRATION, "devices": 8})
    plain = extrapolation_check(ModelInputs(inputs.configs, at8, BUCKETS))
    assert "calibrated at 8 all the same" in beyond_measured(16, 8, [plain])
    at2 = extrapolation_check(
        ModelInputs(inputs.configs, Calibration.from_dict(CALIBRATION), BUCKETS)
    )
    assert "extrapolated from a calibration up to 2" in beyond_measured(16, 8, [at2])


def test_the_extrapolation_check_is_the_refits_error_on_measured_rows():
    """On a committed fit sweep (tests/data/heldout, measured at 1, 2 and 4 devices): the
    figure `platform predict` quotes beyond the widest count is the refit's own error, fitted
    without the 4-device points and predicting them."""
    from amdahl.analysis.selfcheck import extrapolation_check
    from amdahl.report.predict import load_model_inputs

    inputs = load_model_inputs(HELDOUT / "fit")
    refit = fit(inputs, [p for p in inputs.points() if p.devices < 4])
    at4 = [p for p in inputs.points() if p.devices == 4]
    errs = [
        abs(
            refit.predict(refit.families[p.family], 4, p.batch, 1, withhold=False).throughput
            - p.throughput
        )
        / p.throughput
        for p in at4
    ]
    check = extrapolation_check(inputs)
    assert (check.fitted_max, check.held_out, check.points) == (2, 4, len(errs))
    assert check.median == pytest.approx(statistics.median(errs))


def test_a_prediction_quotes_the_check_measured_nearest_its_distance():
    """Swept at 1, 2, 4 and 8 devices (a committed held-out set's fit and truth sweeps together,
    measured rows): 2 -> 4 and 4 -> 8 check 2x out, 2 -> 8 4x out. A 16-device prediction (2x
    the widest) quotes the widest 2x check, a 32-device one (4x) the 4x check, a 64-device one
    (8x) the farthest, saying it is farther out than any; each figure is that refit's own
    error."""
    import dataclasses

    from amdahl.analysis.selfcheck import beyond_measured, extrapolation_checks, nearest_check
    from amdahl.report.predict import load_model_inputs

    fit_inputs = load_model_inputs(HELDOUT / "fit")
    truth = load_model_inputs(HELDOUT / "truth")
    inputs = dataclasses.replace(fit_inputs, configs=[*fit_inputs.configs, *truth.configs])
    checks = extrapolation_checks(inputs)
    assert {(c.fitted_max, c.held_out) for c in checks} == {(2, 4), (2, 8), (4, 8)}
    points = inputs.points()
    for c in checks:  # each figure is the refit on the counts up to fitted_max, at held_out
        refit = fit(inputs, [p for p in points if p.devices <= c.fitted_max])
        errs = [
            abs(
                refit.predict(
                    refit.families[p.family], p.devices, p.batch, 1, withhold=False
                ).throughput
                - p.throughput
            )
            / p.throughput
            for p in points
            if p.devices == c.held_out
        ]
        assert c.median == pytest.approx(statistics.median(errs)) and c.points == len(errs)
    assert (nearest_check(2, checks).fitted_max, nearest_check(2, checks).held_out) == (4, 8)
    assert (nearest_check(3, checks).fitted_max, nearest_check(3, checks).held_out) == (2, 8)
    assert (nearest_check(8, checks).fitted_max, nearest_check(8, checks).held_out) == (2, 8)
    at16, at64 = beyond_measured(16, 8, checks), beyond_measured(64, 8, checks)
    assert "checked as far out: fitted up to 4 devices, the model predicted 8 (2x)" in at16
    assert "the farthest check: fitted up to 2 devices, the model predicted 8 (4x)" in at64
    assert at64.endswith("farther out, expect more") and "expect more" not in at16
    assert nearest_check(2, []) is None


def test_a_loose_theta_is_fixed_at_a_value_that_fits_not_at_1_regardless():
    """gamma 1, theta 4, compute 10x the calibrated comm: the points leave theta loose, but 1
    does not fit them; the fixed theta is the fitting value nearest 1, and the steps fit."""
    from amdahl.analysis.overlapfit import fit_overlap

    obs = tuple((10.0 * k, 1.0 * k, 10.0 * k + 4.0 * k) for k in (1, 2, 3))
    gamma, theta, note = fit_overlap(obs)
    assert theta > 1.5 and "nearest its prior 1" in note
    for c, n, t in obs:
        assert combine(c, theta * n, gamma) == pytest.approx(t, rel=0.03)


def test_gloo_counts_above_the_nodes_cores_fit_a_law_of_their_own():
    """Calibrated over 2, 3 and 4 gloo ranks on 2 cores: 3 and 4 measured ranks queueing for
    cores. They leave the within-cores growth (the link there is the 2-rank one) and fit the
    oversubscribed law, which must give back its own curve at 16 ranks, while a calibrated
    count keeps its measurement. NCCL keeps every count in one power law."""
    import math

    from amdahl.analysis.comm import comm_model

    a2, b2 = 3e-4, 1e9
    law = {q: (a2 * (1 + 1.5 * math.log(q / 2)), b2 * (q / 2) ** -0.5) for q in (2, 3, 4, 16)}
    by = {str(q): {"alpha_s": a, "bandwidth_Bps": b} for q, (a, b) in law.items() if q != 16}
    by["3"]["alpha_s"] *= 1.01  # a measurement is never exactly on the law
    raw = {**CALIBRATION, "alpha_s": law[4][0], "bandwidth_Bps": law[4][1], "devices": 4}
    gloo = comm_model(Calibration.from_dict({**raw, "by_devices": by}), host_cores=2)
    assert gloo.calibrated_devices == 2 and gloo.intra.alpha_s == pytest.approx(a2)
    assert gloo.calibrated_range == (2, 4)
    over = gloo.oversubscribed
    assert over.counts == (3, 4) and over.cores == 2
    assert over.alpha_log == pytest.approx(1.5, rel=0.02)
    assert over.bandwidth_exp == pytest.approx(0.5, rel=1e-6)
    at16, _ = gloo.link(1, 16)
    assert at16.alpha_s == pytest.approx(law[16][0], rel=0.02)
    assert at16.bandwidth_Bps == pytest.approx(law[16][1], rel=1e-6)
    assert gloo.link(1, 3)[0].alpha_s == by["3"]["alpha_s"]  # measured there: as measured
    assert gloo.link(1, 2)[0].alpha_s == pytest.approx(a2)
    assert gloo.queueing_measured(16) and gloo.queueing_measured(3)
    assert not gloo.queueing_measured(2) and not gloo.queueing_measured(16, nodes=2)
    assert "ln(p/2)" in gloo.growth() and "fitted at 3, 4" in gloo.growth()
    # beyond the widest calibrated count the law is extrapolated; its alternative holds the
    # link at that count's calibration, and leaves the calibrated counts as measured
    assert gloo.law_extrapolated(16) == 4 and gloo.law_extrapolated(4) is None
    assert gloo.law_extrapolated(3) is None and gloo.law_extrapolated(16, nodes=2) is None
    held = gloo.held()
    assert held.link(1, 16)[0] == gloo.link(1, 4)[0]
    assert held.link(1, 3)[0] == gloo.link(1, 3)[0] and held.link(1, 2)[0] == gloo.link(1, 2)[0]
    from amdahl.analysis.prediction import _oversubscribed_dict

    as_json = _oversubscribed_dict(over)  # what `platform predict --json` prints
    assert as_json["calibrated_counts"] == [3, 4] and as_json["alpha_log"] == over.alpha_log
    nccl = comm_model(Calibration.from_dict({**raw, "backend": "nccl", "by_devices": by}), 2)
    assert set(nccl.by_devices) == {2, 3, 4} and nccl.oversubscribed is None
    assert not nccl.queueing_measured(16)


def test_gloo_within_the_nodes_cores_has_no_oversubscribed_law():
    """16 cores, calibrated at 2-4 ranks: nothing above the cores was measured, so no law of
    its own (the contention term stretches gloo there instead)."""
    from amdahl.analysis.comm import comm_model

    by = {str(q): {"alpha_s": 1e-4, "bandwidth_Bps": 2e9} for q in (2, 3, 4)}
    raw = {**CALIBRATION, "devices": 4, "by_devices": by}
    gloo = comm_model(Calibration.from_dict(raw), host_cores=16)
    assert gloo.oversubscribed is None and set(gloo.by_devices) == {2, 3, 4}
    assert not gloo.queueing_measured(32)


def test_accumulation_divides_the_communication_per_sample():
    """A family at accumulate_steps 4 runs 4 passes of compute per all-reduce: the same
    communication per step over 4 times the samples; a family not measured yet (its rows
    failed) takes its passes per step from its axis value."""
    link = Link(ALPHA, BANDWIDTH, "intra-node")
    a, b, wait = 2e-3, 5e-5, 1e-3
    rows = []
    for micro in (1, 4):
        for p in (1, 2, 4, 8):
            for bs in (32, 64, 128, 256):
                tn = comm_volume("ddp", p, 4e6, BUCKETS).seconds(link)
                wall = combine(micro * (a + b * bs), tn, 2.5) + wait
                rows.append(
                    row(
                        p,
                        bs,
                        "ddp",
                        bs * p * micro / wall,
                        wall=wall,
                        data_wait_s=wait,
                        trial_id=f"d{p}b{bs}a{micro}",
                        global_batch=bs * p * micro,
                        micro_steps=micro,
                        accumulate_steps=micro,
                    )
                )
    failed = row(2, 64, "ddp", trial_id="a2", accumulate_steps=2, status="oom", micro_steps=None)
    model = fit(_inputs(conform([*rows, failed])))
    fams = {f.settings["accumulate_steps"]: f for f in model.families.values()}
    assert (fams[1].micro, fams[2].micro, fams[4].micro) == (1, 2, 4)
    one, four = model.predict(fams[1], 32, 128.0), model.predict(fams[4], 32, 128.0)
    tn = comm_volume("ddp", 32, 4e6, BUCKETS).seconds(link)
    assert four.comm_s == pytest.approx(one.comm_s)  # per optimizer step: once
    expected = 128 * 32 * 4 / (combine(4 * (a + b * 128), tn, 2.5) + wait)
    assert four.throughput == pytest.approx(expected, rel=1e-2)
    assert four.throughput > one.throughput
