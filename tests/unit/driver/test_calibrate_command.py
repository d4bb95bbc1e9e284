"""The calibration driver's checks and helpers that need no Ray."""

import json

import pytest
import yaml
from report_rows import conform, scaling_rows, write_sweep

from amdahl.analysis.alphabeta import fit_alpha_beta, ring_allreduce_s
from amdahl.analysis.calibration import Calibration
from amdahl.driver.calibrate import (
    CPU_MAX_BYTES,
    GPU_MAX_BYTES,
    grad_bytes,
    run_calibration,
    summary,
)
from amdahl.errors import UserError
from amdahl.protocol.items import message_sizes
from amdahl.report import build_report, report_from_rows


def test_one_device_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UserError, match="at least 2 workers"):
        run_calibration(1, tmp_path)


def test_gradient_bytes_for_every_model_the_sweep_trains(tmp_path):
    assert grad_bytes(tmp_path) == {}  # no spec.yaml: unknown, and the report says so
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"workload": "mlp", "params": {}}))
    plan = {"trials": [{"settings": {"params": {"inputs": 8, "hidden": [4], "classes": 2}}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    got = grad_bytes(tmp_path)
    mlp = (512 * 256 + 256 + 256 * 128 + 128 + 128 * 2 + 2) * 4
    assert got["grad_bytes"] == mlp
    small = json.dumps({"inputs": 8, "hidden": [4], "classes": 2}, sort_keys=True)
    assert got["grad_bytes_by_params"][small] == (8 * 4 + 4 + 4 * 2 + 2) * 4


def test_summary_names_latency_bandwidth_and_peak():
    text = summary(
        {
            "devices": 2,
            "backend": "gloo",
            "device_name": "cpu",
            "alpha_s": 5e-5,
            "bandwidth_Bps": 1.5e9,
            "fit_rel_rmse": 0.1,
            "all_reduce": [{"bytes": 1024.0, "seconds": 1e-4, "busbw_Bps": 1e7}],
            "peak_flops": {"fp32": 5e10},
            "peak_source": "measured",
        }
    )
    assert "alpha = 50.0 us" in text and "1.500 GB/s" in text and "50.0 GFLOP/s" in text


# --------------------------------------------------------------------------- message sizes, fit


def test_message_sizes_reach_nccl_bulk_sizes_on_gpu_and_stay_small_on_cpu():
    cpu, gpu = message_sizes(CPU_MAX_BYTES), message_sizes(GPU_MAX_BYTES)
    assert cpu[0] == 4 and cpu[-1] == 16 * 2**20
    assert gpu[-1] == 512 * 2**20 and 143e6 < gpu[-2] < gpu[-1]  # past scaling.yaml's gradients
    bulk = gpu[gpu.index(2**20) :]
    assert bulk == [2**k for k in range(20, 30)]  # every doubling from 1 MiB
    assert message_sizes(1000)[-1] == 1000 and message_sizes(16) == [4, 16]
    with pytest.raises(UserError, match="--max-bytes 8"):
        message_sizes(8)


def _nccl_like(p: int, sizes: list[int], alpha: float, bw: float) -> list[float]:
    """All-reduce times with NCCL's protocol switches: a low-latency protocol at a fraction of
    the bandwidth for small messages, an intermediate one, and the bulk protocol (full bandwidth,
    higher start-up) from 4 MiB."""
    times = []
    for n in sizes:
        if n <= 64 * 1024:
            start, link = alpha, bw / 8
        elif n < 4 * 2**20:
            start, link = 2 * alpha, bw / 2
        else:
            start, link = 4 * alpha, bw
        times.append(2 * (p - 1) * start + 2 * (p - 1) / p * n / link)
    return times


def _all_sizes_fit(p: int, sizes: list[float], seconds: list[float]) -> float:
    """The bandwidth the previous fit gave: one line through every size, least squares on
    relative error."""
    w = [1 / t**2 for t in seconds]
    sw, swn = sum(w), sum(wi * n for wi, n in zip(w, sizes, strict=True))
    swnn = sum(wi * n * n for wi, n in zip(w, sizes, strict=True))
    swt = sum(wi * t for wi, t in zip(w, seconds, strict=True))
    swnt = sum(wi * n * t for wi, n, t in zip(w, sizes, seconds, strict=True))
    b = (sw * swnt - swn * swt) / (sw * swnn - swn * swn)
    return 2 * (p - 1) / p / b


@pytest.mark.parametrize("p", [2, 8])
def test_bandwidth_is_fitted_on_the_large_messages(p):
    sizes = message_sizes(GPU_MAX_BYTES)
    alpha, bw = 2e-6, 150e9  # NVLink-like: microseconds per ring step, 150 GB/s
    times = _nccl_like(p, sizes, alpha, bw)
    ab = fit_alpha_beta(p, sizes, times)
    assert ab.bandwidth_Bps == pytest.approx(bw, rel=0.02)
    assert ab.alpha_s == pytest.approx(alpha, rel=0.05)
    assert _all_sizes_fit(p, sizes, times) < 0.9 * bw  # what the one-line fit made of it
    # a 143 MB gradient all-reduce: off only by the bulk protocol's start-up, which the
    # small-message alpha leaves out
    big = _nccl_like(p, [143_000_000], alpha, bw)[0]
    assert ring_allreduce_s(p, 143e6, ab.alpha_s, ab.bandwidth_Bps) == pytest.approx(big, rel=0.05)


def test_bandwidth_fit_with_few_large_sizes_uses_the_two_largest():
    sizes = [1024, 65536, 1048576]  # what the integration test measures
    times = [ring_allreduce_s(2, n, 30e-6, 1e9) for n in sizes]
    ab = fit_alpha_beta(2, sizes, times)
    assert ab.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
    assert ab.alpha_s == pytest.approx(30e-6, rel=1e-6)


# --------------------------------------------------------------------------- peaks in the report


def test_each_precision_takes_its_own_measured_peak():
    cal = Calibration.from_dict({"peak_flops": {"fp32": 1e10, "tf32": 5e10, "bf16": 1e11}})
    assert cal.peak_for("fp32") == (1e10, "fp32")
    assert cal.peak_for("tf32") == (5e10, "tf32")  # not the IEEE fp32 peak
    assert cal.peak_for("bf16") == (1e11, "bf16")
    assert cal.peak_for("bf16_weights") == (1e11, "bf16")
    assert cal.peak_for("fp16") == (1e11, "bf16")  # unmeasured fp16: bf16's tensor cores
    assert cal.peak_for(None) == (1e10, "fp32")  # rows from before precision was recorded


def test_a_precision_without_a_calibrated_peak_uses_the_trials_own():
    old = Calibration.from_dict({"peak_flops": {"fp32": 1e10, "bf16": 1e11}})
    assert old.peak_for("tf32") is None  # never the fp32 peak: that read several hundred %
    assert old.peak_for("tf32", row_peak=4e10) == (4e10, "tf32, trial's own")
    assert old.peak_for("fp32", row_peak=4e10) == (1e10, "fp32")  # calibration first
    rows = [
        {"status": "ok", "precision": "tf32", "peak_flops": 3e10},
        {"status": "ok", "precision": "tf32", "peak_flops": 5e10},
        {"status": "ok", "precision": "tf32", "peak_flops": 4e10},
        {"status": "failed", "precision": "tf32", "peak_flops": 9e10},
        {"status": "ok", "precision": "fp16", "peak_flops": None},
    ]
    cal = old.with_row_peaks(rows)
    assert cal.row_peak_flops == {"tf32": 4e10}
    assert cal.peak_for("tf32") == (4e10, "tf32, trial's own")
    assert cal.peak_for("fp16") == (1e11, "bf16")


def _tf32_rows(peak):
    rows = scaling_rows()
    for r in rows:
        r.update(precision="tf32", achieved_flops=r["throughput"] * 1e6, peak_flops=peak)
    return rows


def test_report_mfu_of_tf32_rows_is_against_the_tf32_peak():
    calib = {"peak_flops": {"fp32": 1e9, "tf32": 4e9}, "peak_source": "measured: test"}
    rep = report_from_rows(conform(_tf32_rows(None)), calibration=calib)
    d4 = next(d for d in rep.diagnoses if d.config.devices == 4 and d.config.sync == "ddp")
    assert d4.mfu == pytest.approx(2000 * 1e6 / (4 * 4e9))
    assert d4.mfu_peak == "tf32"


def test_report_mfu_falls_back_to_the_rows_own_peak(tmp_path):
    calib = {"peak_flops": {"fp32": 1e9, "bf16": 8e9}, "peak_source": "measured: test"}
    d = write_sweep(tmp_path / "s", _tf32_rows(5e9), calibration=calib)
    rep = build_report(d)
    d4 = next(d for d in rep.diagnoses if d.config.devices == 4 and d.config.sync == "ddp")
    assert d4.mfu == pytest.approx(2000 * 1e6 / (4 * 5e9))  # not 4x higher against fp32
    assert d4.mfu_peak == "tf32, trial's own"


# --------------------------------------------------------------------------- driver order
# The measurement itself, the order of its two writes and joining a given cluster run on real
# local Ray in tests/integration/test_calibrate.py.


def test_a_bad_workload_fails_before_anything_is_measured(tmp_path):
    import ray

    spec = {"workload": "no_such_module:Model", "params": {}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    initialized = ray.is_initialized()
    with pytest.raises(UserError, match="no_such_module"):
        run_calibration(2, tmp_path)
    # No Ray was started or joined (connect_ray routes Ray's log to ray.log) and nothing written.
    assert ray.is_initialized() == initialized
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
