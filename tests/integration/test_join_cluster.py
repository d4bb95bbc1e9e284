"""`platform sweep` joins the Ray cluster running where it runs (as after `ray up` and
`ray attach`), the way `ray.init()` finds it, and says which; `--local` starts its own.
`platform plan` plans for the machines the sweep would run on, by the same rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


#: What a shell on a cluster's node has (cluster.yaml): Ray's token authentication on, which
#: `ray start` turns on by default and a client must be told of.
AUTH = {"RAY_AUTH_MODE": "token"}


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    """A one-node Ray cluster started by `ray start --head --block` (once it says it started),
    stopped by its handle; one for the module: the tests leave it running."""
    port = free_port()
    temp_dir = Path("/tmp") / f"amdahl-join-{os.getpid()}"  # Ray's socket paths must be short
    log = tmp_path_factory.mktemp("head") / "ray_start.log"
    with log.open("w") as out:
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
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **AUTH},
        )
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert proc.poll() is None, log.read_text()[-3000:]
        yield f"127.0.0.1:{port}", proc
    finally:
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
    env.update(AUTH)
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


def test_platform_plan_plans_for_the_cluster_sweep_would_join(head_node, tmp_path):
    address, proc = head_node
    (tmp_path / "joined.yaml").write_text(SPEC)
    env = {**os.environ, **AUTH, "RAY_ADDRESS": address}  # as after `ray attach`

    def plan(*args: str) -> dict:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "platform"), "plan", "joined.yaml", "--json", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout)

    joined = plan()
    assert [(n["cpus"], n["gpus"]) for n in joined["nodes"]] == [(2.0, 0.0)]
    assert joined["nodes"][0]["name"] != "local"  # the cluster's node, by its address
    assert [n["name"] for n in plan("--local")["nodes"]] == ["local"]  # as `sweep --local`
    assert proc.poll() is None  # joined, not stopped
