"""`platform sweep` joins the Ray cluster running where it runs (as after `ray up` and
`ray attach`), the way `ray.init()` finds it, and says which; `--local` starts its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow_server import free_port

from amdahl import read_results

pytestmark = pytest.mark.integration

RAY = Path(sys.executable).parent / "ray"
SPEC = """name: joined
workload: mlp
params: {hidden: [32], train_rows: 1024, val_rows: 128}
train: {steps: 10, warmup_steps: 2}
grid: {devices: [1, 2], batch_size: [32]}
resources: {cpus_per_device: 0.5, cpus_per_data_worker: 0.5}
tracking: {enabled: false}
"""


@pytest.fixture
def head_node(tmp_path):
    """A one-node Ray cluster started by `ray start --head --block`, stopped by its handle."""
    port = free_port()
    temp_dir = Path("/tmp") / f"amdahl-join-{os.getpid()}"  # Ray's socket paths must be short
    proc = subprocess.Popen(
        [
            str(RAY),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield f"127.0.0.1:{port}", proc
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_platform_sweep_joins_the_running_cluster_and_says_so(head_node, tmp_path):
    address, proc = head_node
    (tmp_path / "joined.yaml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["RAY_ADDRESS"] = address  # what `ray attach` gives a shell on the head node
    done = subprocess.run(
        [str(Path(sys.executable).parent / "platform"), "sweep", "joined.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert proc.poll() is None  # the cluster outlives the sweep that joined it
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("Ray: "))
    assert line.startswith("Ray: joined 1 node, 2 CPUs") and address.split(":")[1] in line
    (sweep_dir,) = (tmp_path / "runs").glob("joined-*")
    rows = read_results(sweep_dir).to_pylist()
    assert sorted((r["devices"], r["status"]) for r in rows) == [(1, "ok"), (2, "ok")]
    assert "1 worker group started" in done.stdout
