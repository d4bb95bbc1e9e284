"""Several raylets on this machine: placement follows the plan, impossible shapes are refused
before launch, a node removed mid-sweep does not stop the sweep, and a rank's shard is on its
own node before its first trial."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

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


def test_a_ranks_shard_is_fetched_onto_its_node_before_the_loop_reads_it(multinode):
    """`train_source` on a worker node (the d1 baseline's whole training set, and rank 1 of 2):
    the blocks, in the driver's store on the head node before, are on the rank's node after,
    and the loop then reads a pass of them as the tables the rank holds."""
    shards = multinode["local_shard"]
    assert set(shards) == {"d1r0", "d2r1"}
    for name, shard in shards.items():
        node, blocks = shard["node"], shard["blocks"]
        assert blocks > 0 and len(shard["before"]) == len(shard["after"]) == blocks, name
        assert all(multinode["head"] in nodes for nodes in shard["before"]), shard["before"]
        assert all(node in nodes for nodes in shard["after"]), (name, shard["after"])
        # Timed around the fetch alone: inside the driver's own bracket of the remote call.
        assert shard["fetch_s"] is not None and 0 < shard["fetch_s"] <= shard["call_s"], shard
        # The loop reads the fetched copies this rank holds (a LocalShard), a whole pass of them.
        assert shard["held"] and shard["rows"] > 0, shard
        assert shard["shard_rows"] - shard["rows"] < 256, shard
    # The baseline's blocks were only on the head before: the fetch moved them.
    assert all(nodes == [multinode["head"]] for nodes in shards["d1r0"]["before"])


def test_packed_workers_share_a_node(multinode):
    packed = multinode["pack"]
    assert packed["status"] == "ok", packed["error"]
    assert len(set(packed["nodes"])) == 1
    assert multinode["head"] not in packed["nodes"]  # the 1-CPU head cannot hold both


def test_spread_workers_use_different_nodes(multinode):
    spread = multinode["spread"]
    assert spread["status"] == "ok", spread["error"]
    assert len(set(spread["nodes"])) == 2


def test_ray_state_goes_to_the_shared_storage(multinode):
    for placement in ("pack", "spread"):
        assert {"train", "tune-1"} <= set(multinode[placement]["storage"]), multinode[placement]
        assert not multinode[placement]["local_ray_dir"]


def test_a_two_node_launch_runs_without_shared_storage(multinode):
    """No Train checkpoint in the protocol: a sweep over nodes that share no storage plans and
    runs a launch whose ranks sit on two nodes."""
    run = multinode["no_storage"]
    assert run["status"] == "ok", run["error"]
    assert len(set(run["nodes"])) == 2


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


def test_own_workload_reaches_workers_on_other_nodes_through_the_runtime_env(multinode):
    """The package and its helper module live in a folder on no import path; the driver finds
    them through `workload_path`, and the train workers on worker nodes import Ray's unpacked
    copy (the workload itself raises otherwise), not an inherited PYTHONPATH."""
    byo = multinode["byo"]
    assert byo["inherited"] == []
    assert [r["status"] for r in byo["rows"]] == ["ok"], byo["rows"]
    assert set(byo["rows"][0]["nodes"]) - {byo["head"]}  # ranks on a worker node
    assert byo["cpus_per_device"] == 1  # resources: auto, 2 devices fit the nodes left
