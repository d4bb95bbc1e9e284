"""Does the platform's timed loop cost throughput? Platform DDP trial vs a plain DDP script.

For the MLP and the small GPT, 2 workers, the same model, per-device batch, torch threads,
optimizer, warmup and steps, interleaved A/B rounds:
  platform  one trial through `run_sweep` (Ray Tune -> Ray Train worker group -> harness, fed
            by Ray Data), throughput from its results row
  plain     torch.multiprocessing + gloo DDP over in-memory tensors, the same loop without any
            of the platform's timers, timed from the end of warmup to the last step
and prints the median ratio platform / plain per workload. Goal (docs/architecture.md): >= 0.97.

    python benchmarks/harness_overhead.py [--rounds N] [--steps N (both workloads)]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Measured steps give each run about 10-20 s of steps here: shorter windows made the plain
#: baseline itself vary by 20% between rounds.
WORKLOADS = {
    "mlp": {"params": {}, "batch": 256, "steps": 2000},
    "gpt": {
        "params": {"vocab": 256, "width": 128, "layers": 2, "context": 64},
        "batch": 16,
        "steps": 400,
    },
}


def _plain_worker(
    rank: int,
    world: int,
    port: int,
    name: str,
    params: dict,
    batch: int,
    warmup: int,
    steps: int,
    out: dict,
) -> None:
    from amdahl.workload import make_workload

    torch.set_num_threads(1)  # the platform's workers: max(1, floor(cpus_per_device=0.5))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    workload = make_workload(name, params)
    data = {
        k: torch.from_numpy(v)
        for k, v in workload.generate("train", workload.rows("train"), seed=0).items()
    }
    n = len(next(iter(data.values()))) // world
    shard = {k: v[rank * n : (rank + 1) * n] for k, v in data.items()}
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(workload.build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        i = (step * batch) % (n - batch)
        x, y = workload.split_batch({k: v[i : i + batch] for k, v in shard.items()})
        loss = workload.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    dist.barrier()
    elapsed = time.perf_counter() - start
    out[rank] = batch * steps / elapsed
    dist.destroy_process_group()


def plain_throughput(name: str, warmup: int, steps: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    cfg = WORKLOADS[name]
    mp.spawn(
        _plain_worker,
        args=(2, port, name, cfg["params"], cfg["batch"], warmup, steps, out),
        nprocs=2,
        join=True,
    )
    return sum(out.values())


def platform_throughput(name: str, warmup: int, steps: int, runs_dir: Path) -> float:
    from amdahl import run_sweep, validate_spec

    cfg = WORKLOADS[name]
    spec = validate_spec(
        {
            "name": f"overhead-{name}",
            "workload": name,
            "params": cfg["params"],
            "train": {"steps": steps, "warmup_steps": warmup},
            "grid": {"devices": [2], "batch_size": [cfg["batch"]], "sync": ["ddp"]},
            "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
        }
    )
    outcome = run_sweep(spec, runs_dir=runs_dir, tracking=False)
    (row,) = outcome.rows
    assert row["status"] == "ok", row["error"]
    return row["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="default: per workload")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    import ray

    work = Path(tempfile.mkdtemp(prefix="amdahl-bench-"))
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ratios: dict[str, list[float]] = {name: [] for name in WORKLOADS}
    for r in range(args.rounds):
        for name, cfg in WORKLOADS.items():
            steps = args.steps or cfg["steps"]
            a = platform_throughput(name, args.warmup, steps, work)
            b = plain_throughput(name, args.warmup, steps)
            ratios[name].append(a / b)
            print(
                f"round {r} {name}: platform {a:,.0f} samples/s, plain {b:,.0f} samples/s, "
                f"ratio {a / b:.3f}",
                flush=True,
            )
    ray.shutdown()
    for name, values in ratios.items():
        print(
            f"{name}: platform / plain DDP throughput, median of {len(values)}: "
            f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"
        )


if __name__ == "__main__":
    main()
