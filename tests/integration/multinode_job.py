"""Run by test_multinode.py in a child process: a local multi-node Ray cluster (several raylets
on this machine with distinct resources, `ray.cluster_utils.Cluster`) and sweeps on it.

Prints one JSON object with what the test checks. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from amdahl import read_results, run_sweep, validate_spec
from amdahl.run import make_plan, ray_nodes


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
        }
    )


def main(out_dir: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=3) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    head_id = ray.get_runtime_context().get_node_id()
    report: dict = {"head": head_id}

    for placement in ("pack", "spread"):
        outcome = run_sweep(
            _spec(f"place-{placement}", [2], placement), runs_dir=out_dir, tracking=False
        )
        (row,) = read_results(outcome.sweep_dir).to_pylist()
        report[placement] = {
            "status": row["status"],
            "error": row["error"],
            "nodes": json.loads(row["nodes"]),
        }

    # A shape no node can hold: 4-CPU workers on 3-CPU nodes (7 CPUs in total would fit).
    too_big = make_plan(
        validate_spec(
            {
                "name": "big",
                "workload": "mlp",
                "grid": {"devices": [1]},
                "resources": {"cpus_per_device": 4, "cpus_per_data_worker": 0.25},
            }
        ),
        ray_nodes(),
    )
    report["refused"] = too_big.trials[0].refused

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

    def on_event(kind: str, payload: dict) -> None:
        if kind == "trial_done" and not removed.is_set():
            removed.set()
            node = next(w for w in workers if w.node_id in json.loads(payload["row"]["nodes"]))
            threading.Thread(target=cluster.remove_node, args=(node,), daemon=True).start()

    spec = _spec("node-removed", [1], "pack", {"steps": 1500, "max_failures": 1})
    spec = spec.model_copy(
        update={"grid": spec.grid.model_copy(update={"batch_size": [16, 32, 64]})}
    )
    outcome = run_sweep(spec, runs_dir=out_dir, tracking=False, on_event=on_event)
    rows = read_results(outcome.sweep_dir).to_pylist()
    report["removed"] = [{"status": r["status"], "error": r["error"]} for r in rows]
    print("MULTINODE " + json.dumps(report), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
