"""`platform calibrate` on local Ray: all-reduce times over message sizes, the alpha-beta fit,
a measured peak per precision and the model's gradient bytes, stored in calibration.json for the
report."""

import json

import pytest
import yaml

from amdahl.driver.calibrate import run_calibration
from amdahl.report import build_report

pytestmark = pytest.mark.integration

SIZES = [1024, 65536, 1048576]


def test_calibration_writes_what_the_report_reads(ray_cluster, tmp_path):
    spec = {"name": "c", "workload": "mlp", "params": {"hidden": [32]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))

    result = run_calibration(2, tmp_path, sizes=SIZES)

    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert stored == json.loads(json.dumps(result))
    assert stored["devices"] == 2 and stored["backend"] == "gloo"
    assert [m["bytes"] for m in stored["all_reduce"]] == SIZES
    assert all(m["seconds"] > 0 and m["busbw_Bps"] > 0 for m in stored["all_reduce"])
    assert stored["alpha_s"] >= 0 and stored["bandwidth_Bps"] > 0
    # one peak per precision, by the harness's probe (CPU: tf32 is fp32, no fp16)
    assert set(stored["peak_flops"]) == {"fp32", "tf32", "bf16"}
    assert all(v > 0 for v in stored["peak_flops"].values())
    assert stored["peak_source"].startswith("measured")
    # MLP 512-32-2: (512*32 + 32 + 32*2 + 2) fp32 gradients
    assert stored["grad_bytes"] == (512 * 32 + 32 + 32 * 2 + 2) * 4
    assert ray_cluster.is_initialized()  # a Ray it did not start is left running

    calibration = build_report(tmp_path).calibration
    assert calibration.alpha_s == pytest.approx(stored["alpha_s"])
    assert calibration.grad_bytes == stored["grad_bytes"]
    assert calibration.peak_for("tf32") == (stored["peak_flops"]["tf32"], "tf32")
