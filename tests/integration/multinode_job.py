"""Run by test_multinode.py in a child process: a local multi-node Ray cluster (several raylets
on this machine with distinct resources, `ray.cluster_utils.Cluster`) and sweeps on it.

Prints one JSON object with what the test checks. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from amdahl import read_results, run_sweep, validate_spec
from amdahl.driver.events import SweepEvent, TrialDone
from amdahl.driver.planning import plan_for
from amdahl.workload.code import make_workload

# tests/ (trial_runner's LaunchConfig factory), for this script run on its own.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trial_runner import launch_config, trial_config  # noqa: E402

_MLP = {"hidden": [32], "train_rows": 8192, "val_rows": 256}

#: Ray's storage for the sweeps below, set by main(): a plan over several nodes needs storage
#: every node reaches (plan.check_storage); these "nodes" are raylets on one machine, so a
#: local folder is one.
STORAGE: str | None = None


def _spec(
    name: str,
    devices: list[int],
    placement: str,
    extra: dict | None = None,
    workload: str = "mlp",
):
    return validate_spec(
        {
            "name": name,
            "workload": workload,
            "params": {"hidden": [32], "train_rows": 2048, "val_rows": 256},
            "train": {"steps": 20, "warmup_steps": 2, **(extra or {})},
            "grid": {"devices": devices, "batch_size": [32]},
            "resources": {
                "cpus_per_device": 1,
                "cpus_per_data_worker": 0.25,
                "placement": placement,
            },
            "storage": STORAGE,
        }
    )


@ray.remote(num_cpus=0)
class _Rank:
    """Stands in for a train worker on a given node: gets its shard through `train_source`,
    as the harness does before a rank's first trial, then reads a pass of it the way the timed
    loop does (`host_batches`)."""

    def fetch(self, launch: Any, rank: int, world: int) -> float | None:
        from amdahl.worker.input import train_source

        self.source = train_source(launch, make_workload("mlp", _MLP), rank, world)
        return getattr(self.source, "fetch_s", None)

    def read(self) -> dict:
        from amdahl.worker.input import LocalShard, host_batches

        source = self.source
        held = isinstance(source, LocalShard)
        batch = 256
        batches = host_batches(source, batch, prefetch=4, pin=False)
        steps = source.rows // batch if held else 1
        rows = sum(len(next(batches)["y"]) for _ in range(steps))
        # Every table the loop reads is a value this process holds: no object is read again.
        return {"held": held, "rows": rows, "shard_rows": source.rows if held else None}


def _locations(refs: list, node_id: str, timeout_s: float = 10.0) -> list[list[str]]:
    """Each block's nodes, once every block is on `node_id` (Ray reports new copies to the
    owner asynchronously) or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [v["node_ids"] for v in ray.experimental.get_object_locations(refs).values()]
        if all(node_id in nodes for nodes in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _shards_on_their_nodes(workers: list) -> dict:
    """Shards made as a sweep makes them (local parquet -> blocks in this driver's store,
    `rank_shards`, `repeat_to_cover`), each given to `train_source` on a worker node: where the
    blocks were before and after, the fetch time, and what the loop then read locally."""
    from amdahl.data.prepare import rank_shards, ray_dataset, repeat_to_cover
    from amdahl.data.storage import stored_dataset
    from amdahl.worker.input import shard_blocks

    base = ray_dataset(stored_dataset(make_workload("mlp", _MLP), "mlp", "train", 0), 0.25)
    per_rank = 2 * _MLP["train_rows"]
    shards = {
        world: [repeat_to_cover(s, per_rank) for s in rank_shards(base, world)] for world in (1, 2)
    }
    launch = launch_config((trial_config(input="ray_data"),)).with_inputs(train_shards=shards)
    out = {}
    # The d1 baseline (the whole training set) and rank 1 of 2, each on its own worker node.
    for (world, rank), node in zip(((1, 0), (2, 1)), workers, strict=True):
        refs = list(shard_blocks(shards[world][rank]))
        before = _locations(refs, node.node_id, timeout_s=0)
        actor = _Rank.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        ).remote()
        ray.get(actor.__ray_ready__.remote())  # the actor is up: the bracket below is the call
        call_start = time.perf_counter()
        fetch_s = ray.get(actor.fetch.remote(launch, rank, world))
        call_s = time.perf_counter() - call_start
        after = _locations(refs, node.node_id)
        out[f"d{world}r{rank}"] = {
            "node": node.node_id,
            "blocks": len(refs),
            "before": before,
            "after": after,
            "fetch_s": fetch_s,
            "call_s": call_s,
            **ray.get(actor.read.remote()),
        }
        ray.kill(actor)
    return out


def main(out_dir: Path) -> None:
    global STORAGE
    STORAGE = str((out_dir / "shared-storage").resolve())
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=3) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    head_id = ray.get_runtime_context().get_node_id()
    report: dict = {"head": head_id, "local_shard": _shards_on_their_nodes(workers)}

    for placement in ("pack", "spread"):
        outcome = run_sweep(
            _spec(f"place-{placement}", [2], placement), runs_dir=out_dir, tracking=False
        )
        (row,) = read_results(outcome.sweep_dir).to_pylist()
        report[placement] = {
            "status": row["status"],
            "error": row["error"],
            "nodes": json.loads(row["nodes"]),
            # Ray's state went to <storage>/<sweep dir name>/, none to the sweep directory.
            "storage": sorted(d.name for d in Path(STORAGE, outcome.sweep_dir.name).iterdir()),
            "local_ray_dir": (outcome.sweep_dir / "ray").exists(),
        }

    # A shape no node can hold: 4-CPU workers on 3-CPU nodes (7 CPUs in total would fit).
    too_big = plan_for(  # the cluster this driver has joined
        validate_spec(
            {
                "name": "big",
                "workload": "mlp",
                "grid": {"devices": [1]},
                "resources": {"cpus_per_device": 4, "cpus_per_data_worker": 0.25},
            }
        ),
    )
    report["refused"] = too_big.trials[0].refused

    # No shared storage: Ray's state stays on each node's disk, and a 2-node launch runs.
    outcome = run_sweep(
        _spec("no-storage", [2], "spread").model_copy(update={"storage": None}),
        runs_dir=out_dir,
        tracking=False,
    )
    (row,) = read_results(outcome.sweep_dir).to_pylist()
    report["no_storage"] = {
        "status": row["status"],
        "error": row["error"],
        "nodes": json.loads(row["nodes"]),
    }

    # One rank fails while the other waits in the all-reduce (flaky_workload.py, importable
    # by the workers because this script's directory is on the driver's path, which Ray
    # passes on): the row must carry the reason, quickly, instead of the launch hanging.
    outcome = run_sweep(
        _spec("one-rank", [2], "pack", workload="flaky_workload:OneRankFails"),
        runs_dir=out_dir,
        tracking=False,
    )
    (row,) = read_results(outcome.sweep_dir).to_pylist()
    report["one_rank"] = {"status": row["status"], "error": row["error"]}

    # A node removed mid-sweep (right after the first trial's row): the launch restarts on
    # the nodes left (train.max_failures) and the sweep goes on.
    removed = threading.Event()

    def on_event(event: SweepEvent) -> None:
        if isinstance(event, TrialDone) and not removed.is_set():
            removed.set()
            node = next(w for w in workers if w.node_id in json.loads(event.row["nodes"]))
            threading.Thread(target=cluster.remove_node, args=(node,), daemon=True).start()

    spec = _spec("node-removed", [1], "pack", {"steps": 1500, "max_failures": 1})
    spec = spec.model_copy(
        update={"grid": spec.grid.model_copy(update={"batch_size": [16, 32, 64]})}
    )
    outcome = run_sweep(spec, runs_dir=out_dir, tracking=False, on_event=on_event)
    rows = read_results(outcome.sweep_dir).to_pylist()
    report["removed"] = [{"status": r["status"], "error": r["error"]} for r in rows]
    report["byo"] = own_workload_on_other_nodes(cluster, out_dir)
    print("MULTINODE " + json.dumps(report), flush=True)
    ray.shutdown()
    cluster.shutdown()


def own_workload_on_other_nodes(cluster: Cluster, out_dir: Path) -> dict:
    """A user's own workload (byo/: a package and a helper module, copied to a folder on no
    import path of this process, its raylets or their workers) in a sweep that amdahl connects
    to this cluster itself, so the job's runtime_env carries the code. TinyRec's
    `require_shipped` makes every train worker check that it imported the copy Ray unpacked."""
    import os
    import shutil

    folder = (out_dir / "byo-folder").resolve()
    shutil.copytree(Path(__file__).resolve().parent / "byo", folder)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
    inherited = [p for p in paths if p and Path(p).resolve() == folder]
    spec = validate_spec(
        {
            "name": "byo",
            "workload": "mypkg.tinyrec:TinyRec",
            "workload_path": str(folder),
            "params": {"require_shipped": True, "train_rows": 1024, "val_rows": 128},
            "train": {"steps": 4, "warmup_steps": 1},
            "grid": {"devices": [2], "batch_size": [32]},
            "storage": STORAGE,
        }
    )
    ray.shutdown()  # run_sweep connects again, with the workload's runtime_env
    outcome = run_sweep(spec, address=cluster.address, runs_dir=out_dir, tracking=False)
    rows = read_results(outcome.sweep_dir).to_pylist()
    return {
        "inherited": inherited,
        "cpus_per_device": outcome.plan.spec.resources.cpus_per_device,
        "rows": [
            {"status": r["status"], "error": r["error"], "nodes": json.loads(r["nodes"])}
            for r in rows
        ],
        "head": ray.get_runtime_context().get_node_id(),
    }


if __name__ == "__main__":
    main(Path(sys.argv[1]))
