"""Several raylets on this machine: placement follows the plan, impossible shapes are refused
before launch, and a node removed mid-sweep does not stop the sweep."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def multinode(tmp_path_factory):
    out = tmp_path_factory.mktemp("multinode")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, str(HERE / "multinode_job.py"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("MULTINODE ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("MULTINODE "))


def test_packed_workers_share_a_node(multinode):
    packed = multinode["pack"]
    assert packed["status"] == "ok", packed["error"]
    assert len(set(packed["nodes"])) == 1
    assert multinode["head"] not in packed["nodes"]  # the 1-CPU head cannot hold both


def test_spread_workers_use_different_nodes(multinode):
    spread = multinode["spread"]
    assert spread["status"] == "ok", spread["error"]
    assert len(set(spread["nodes"])) == 2


def test_shape_no_node_can_hold_is_refused_before_launch(multinode):
    assert "no node combination holds 1 workers of 4 CPU" in multinode["refused"]


def test_node_removed_mid_sweep_does_not_stop_it(multinode):
    removed = multinode["removed"]
    assert len(removed) == 3  # every trial has its row, the sweep finished
    assert all(r["status"] == "ok" for r in removed), removed  # restarted on the node left


def test_a_failure_on_one_rank_only_is_recorded_not_hung(multinode):
    """Rank 1 raises while rank 0 waits in DDP's all-reduce. Before the fix this hung for the
    process group's 600 s timeout, then recorded a gloo transport error instead of the reason."""
    one_rank = multinode["one_rank"]
    assert one_rank["status"] == "failed"
    assert "RankStranded" in one_rank["error"]
    # Had the launch hung, the process group's timeout would have ended it with a gloo
    # transport error in place of this reason.
    assert "injected failure on rank 1 only" in one_rank["error"]
