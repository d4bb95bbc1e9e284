"""The calibration driver's checks and helpers that need no Ray."""

import json

import pytest
import yaml

from amdahl.calibrate import _grad_bytes, run_calibration, summary
from amdahl.errors import UserError


def test_one_device_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(UserError, match="at least 2 workers"):
        run_calibration(1, tmp_path)


def test_gradient_bytes_for_every_model_the_sweep_trains(tmp_path):
    assert _grad_bytes(tmp_path) == {}  # no spec.yaml: unknown, and the report says so
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"workload": "mlp", "params": {}}))
    plan = {"trials": [{"settings": {"params": {"inputs": 8, "hidden": [4], "classes": 2}}}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    got = _grad_bytes(tmp_path)
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
