"""`platform calibrate` on local Ray: all-reduce times over message sizes, the alpha-beta fit,
a measured peak per precision and the model's gradient bytes, stored in calibration.json for the
report; a model that fails to build loses no measurement; a cluster given by address is joined,
and left running."""

import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from amdahl.driver import calibrate
from amdahl.driver.calibrate import finish_calibration, run_calibration
from amdahl.report import build_report

pytestmark = pytest.mark.integration

#: Up to 4 MiB: with 1 MiB the largest, a loaded box could time all three sizes alike (a fit with
#: no bandwidth term is refused).
SIZES = [1024, 131072, 4194304]
#: What the workers measure (worker.calibration_measurement.calibration_result); the rest is
#: the driver's.
MEASURED = ("devices", "backend", "device_name", "all_reduce", "peak_flops", "peak_source")


@pytest.fixture(scope="module")
def calibrated(ray_cluster, tmp_path_factory):
    """One real calibration on the session's local Ray: (sweep directory, what it returned)."""
    sweep = tmp_path_factory.mktemp("calibrate")
    spec = {"name": "c", "workload": "mlp", "params": {"hidden": [32]}}
    (sweep / "spec.yaml").write_text(yaml.safe_dump(spec))
    return sweep, run_calibration(2, sweep, sizes=SIZES)


def test_calibration_writes_what_the_report_reads(ray_cluster, calibrated):
    sweep, result = calibrated
    stored = json.loads((sweep / "calibration.json").read_text())
    assert stored == json.loads(json.dumps(result))
    assert stored["devices"] == 2 and stored["backend"] == "gloo"
    assert [m["bytes"] for m in stored["all_reduce"]] == SIZES
    assert all(m["seconds"] > 0 and m["busbw_Bps"] > 0 for m in stored["all_reduce"])
    # gloo's collective is host work: each rank spends CPU on it, at most its process's share
    # of this box's cores for the call's wall time (medians over rounds: some slack)
    cores = os.cpu_count() or 1
    assert all(0 < m["cpu_seconds"] <= 1.5 * cores * m["seconds"] for m in stored["all_reduce"])
    assert stored["alpha_s"] >= 0 and stored["bandwidth_Bps"] > 0
    # one peak per precision, by the harness's probe (CPU: tf32 is fp32, no fp16)
    assert set(stored["peak_flops"]) == {"fp32", "tf32", "bf16"}
    assert all(v > 0 for v in stored["peak_flops"].values())
    assert stored["peak_source"].startswith("measured")
    # MLP 512-32-2: (512*32 + 32 + 32*2 + 2) fp32 gradients
    assert stored["grad_bytes"] == (512 * 32 + 32 + 32 * 2 + 2) * 4
    assert ray_cluster.is_initialized()  # a Ray it did not start is left running

    calibration = build_report(sweep).calibration
    assert calibration.alpha_s == pytest.approx(stored["alpha_s"])
    assert calibration.grad_bytes == stored["grad_bytes"]
    assert calibration.peak_for("tf32") == (stored["peak_flops"]["tf32"], "tf32")


def test_a_model_that_fails_to_build_loses_no_measurement(calibrated, tmp_path, monkeypatch):
    """The real measurement above, finished into another sweep directory whose model cannot be
    built (MemoryError injected where the models are built): the fitted measurement is already
    on disk when the models are built, and stays there."""
    _, result = calibrated
    measured = copy.deepcopy({k: result[k] for k in MEASURED})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"workload": "mlp", "params": {}}))
    seen = []

    def out_of_memory(models):
        seen.append(json.loads((tmp_path / "calibration.json").read_text()))
        raise MemoryError("no memory for the model")

    monkeypatch.setattr(calibrate, "_grad_bytes_of", out_of_memory)
    with pytest.raises(RuntimeError, match=r"measurement is in .*calibration\.json"):
        finish_calibration(tmp_path, measured, {"CPU": 0.5})
    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert seen == [stored]  # written before the models were built, not touched after
    assert "grad_bytes" not in stored
    assert stored["alpha_s"] == pytest.approx(result["alpha_s"])
    assert stored["bandwidth_Bps"] == pytest.approx(result["bandwidth_Bps"])


def test_calibrate_joins_the_cluster_it_is_given_and_leaves_it_running(ray_cluster, tmp_path):
    """A driver process of its own (no Ray in it), given the session cluster's address: the
    calibration runs as a job of that cluster, the driver disconnects after, the cluster runs
    on."""
    import ray._private.state

    address = ray_cluster.get_runtime_context().gcs_address
    script = textwrap.dedent(
        """
        import json, os, sys
        import ray
        from amdahl.driver.calibrate import run_calibration
        assert not ray.is_initialized()
        sizes = json.loads(sys.argv[3])
        result = run_calibration(2, sys.argv[1], sizes=sizes, address=sys.argv[2])
        after = {"pid": os.getpid(), "initialized": ray.is_initialized()}
        print("CALIBRATED " + json.dumps({**after, "devices": result["devices"]}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), address, json.dumps(SIZES)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("CALIBRATED ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    after = json.loads(lines[-1].removeprefix("CALIBRATED "))
    assert after["devices"] == 2 and (tmp_path / "calibration.json").exists()
    assert after["initialized"] is False  # it let go of the cluster it joined
    jobs = [j for j in ray._private.state.jobs() if j["DriverPid"] == after["pid"]]
    assert len(jobs) == 1 and jobs[0]["IsDead"], jobs  # its job ran on the given cluster
    assert ray_cluster.get(ray_cluster.remote(lambda: 1).remote()) == 1  # which still runs
