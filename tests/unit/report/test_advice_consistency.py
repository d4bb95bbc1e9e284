"""Advice that agrees with the sweep's own measurements (issue 53): a compute-bound fp32
configuration is not told to try bf16 "for faster matmuls" where the device's measured bf16
peak is below fp32's, or where its bf16 twin in this sweep measured no faster."""

from report_rows import row, write_sweep

from amdahl.report import build_report
from amdahl.report.bottleneck import BF16_TIP

COMPUTE = (0.0005, 0.04, 0.08, 0.007)  # data wait, forward, backward, optimizer: compute-bound


def _advice(tmp_path, rows, calibration=None):
    report = build_report(write_sweep(tmp_path / "s", rows, calibration=calibration))
    return {d.config.settings["precision"]: d.advice for d in report.diagnoses}


def test_a_device_whose_bf16_peak_is_below_fp32s_is_not_advised_bf16(tmp_path):
    peaks = {"peak_flops": {"fp32": 143e9, "bf16": 81e9}}
    advice = _advice(tmp_path, [row(1, phases=COMPUTE)], calibration=peaks)["fp32"]
    assert BF16_TIP not in advice
    assert any("bf16 matmul peak (81 GFLOP/s) is not above fp32's (143" in a for a in advice)


def test_a_bf16_twin_measured_no_faster_is_named_instead_of_the_tip(tmp_path):
    rows = [
        row(1, phases=COMPUTE, throughput=1000.0),
        row(1, phases=COMPUTE, throughput=900.0, precision="bf16", trial_id="b"),
    ]
    advice = _advice(tmp_path, rows)["fp32"]
    assert "precision bf16: measured no faster here (900 vs 1,000 samples/s at fp32)" in advice


def test_the_tip_stands_where_nothing_contradicts_it(tmp_path):
    peaks = {"peak_flops": {"fp32": 100e9, "bf16": 400e9}}
    assert BF16_TIP in _advice(tmp_path, [row(1, phases=COMPUTE)], calibration=peaks)["fp32"]


def test_best_yaml_quotes_the_step_time_the_report_shows(tmp_path):
    """One step time everywhere: best.yaml's comment gives the report's (window / steps: 128 ms
    here), not the median step's compute without its input wait (127 ms)."""
    from amdahl.report import write_reports

    spec = {"name": "t", "workload": "mlp", "grid": {"batch_size": [128]}}
    d = write_sweep(tmp_path / "s", [row(1, phases=(0.001, 0.04, 0.08, 0.007))], spec=spec)
    written = write_reports(d)
    best = written["best"].read_text()
    assert "seconds per step" in best and "0.128" in best and "0.127" not in best
    assert "| 128.00 |" in written["markdown"].read_text()
