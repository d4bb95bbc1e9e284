"""Does the platform's timed loop cost throughput? Platform DDP trial vs plain DDP, on Ray or not.

For the MLP and the small GPT, 2 workers, the same model, per-device batch, torch threads,
optimizer, warmup and steps, interleaved rounds of three arms (their order rotates each round):
  platform      one trial through `run_sweep` (Ray Tune -> Ray Train worker group -> harness,
                fed by Ray Data), throughput from its results row
  plain-on-ray  the plain loop below, run in 2 Ray actors holding the CPUs the platform's train
                workers hold (`CPUS_PER_DEVICE` each) with the same torch threads; each actor
                sets up torch.distributed itself (gloo, TCP rendezvous on 127.0.0.1), as Ray's
                own Train release benchmark runs its vanilla baseline: the only difference from
                plain is that the ranks are Ray worker processes, beside Ray's daemons
  plain         torch.multiprocessing + gloo DDP over in-memory tensors, the same loop without
                any of the platform's timers; every arm's plain loop reads a fresh batch each
                step, gathered at shuffled rows of its in-memory shard (nothing else)
The arms are timed alike: every arm's window opens after its warmup with the heap frozen
(`gc.freeze`, as the platform's trial does) and its throughput is the global batch x steps over
the slowest rank's window (the platform's row: the same over its own window). It prints per
workload the median ratios of throughput:
  platform / plain-on-ray   amdahl's own cost (Tune, Train, harness, Ray Data input);
                            goal >= 0.97
  plain-on-ray / plain      Ray's cost (worker processes and daemons sharing the cores)
  platform / plain          both; docs/performance.md "Performance goals": >= 0.95 on the
                            2-core box
Rounds rotate the arms' order; a multiple of the arm count gives each arm each place equally
often. `--inputs ray_data,torch_loader` adds a platform arm per further input pipeline (is the
platform's cost its input?); `torch_loader:0` is one with `data_workers: 0` (the DataLoader in
the training process), `torch_loader:1` the default one worker process.
One local Ray (127.0.0.1 only) serves the whole run. Ratios are measured side by side in one
run; nothing is asserted.

    python benchmarks/harness_overhead.py [--rounds N (default 6)] [--steps N (both workloads)]
        [--workers 1 (the one-device arm; default 2)] [--workloads mlp]
        [--inputs ray_data,torch_loader:1,torch_loader:0] [--smoke]
"""

from __future__ import annotations

import argparse
import operator
import os
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _harness import add_smoke_flag, free_port, paired, print_stamp, rotated

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
WORKERS = 2
#: The platform arm's `resources`: each train worker holds CPUS_PER_DEVICE Ray CPUs and runs
#: max(1, floor(CPUS_PER_DEVICE)) torch threads (the harness's rule); the Ray actors of
#: plain-on-ray hold the same CPUs, and every arm runs THREADS threads per rank.
CPUS_PER_DEVICE = 0.5
CPUS_PER_DATA_WORKER = 0.5
THREADS = max(1, int(CPUS_PER_DEVICE))


class LoopArgs(NamedTuple):
    """`ddp_loop`'s arguments after the rank: one run of the plain loop, as every rank runs it."""

    world: int
    name: str
    params: dict
    batch: int
    warmup: int
    steps: int


def _plain_loop(rank: int, port: int, loop: LoopArgs) -> float:
    """One rank of the plain DDP loop on its own process group; this rank's window seconds."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=loop.world
    )
    try:
        return ddp_loop(rank, *loop)
    finally:
        dist.destroy_process_group()


def ddp_loop(
    rank: int, world: int, name: str, params: dict, batch: int, warmup: int, steps: int
) -> float:
    """The plain DDP loop on the default process group, timed from the end of warmup only, the
    heap frozen for the window as the platform's trial freezes it (benchmarks/loop_overhead.py
    runs it too); this rank's window seconds.

    Each step reads a fresh batch from this rank's in-memory shard, gathered at shuffled rows
    (a new permutation each pass), as a user's loop must: a contiguous slice is a view that
    copies nothing, so a loop reading one pays less per step than any real input does."""
    import gc

    from amdahl.workload import make_workload

    torch.set_num_threads(THREADS)
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
    shuffle = torch.Generator().manual_seed(rank)
    order = torch.randperm(n, generator=shuffle)
    start, i = 0.0, 0
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            gc.freeze()
            start = time.perf_counter()
        if i + batch > n:
            order, i = torch.randperm(n, generator=shuffle), 0
        rows = order[i : i + batch]
        i += batch
        x, y = workload.split_batch({k: v[rows] for k, v in shard.items()})
        loss = workload.loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    window = time.perf_counter() - start
    gc.unfreeze()
    dist.barrier()
    return window


def _plain_worker(rank: int, port: int, loop: LoopArgs, out: dict) -> None:
    out[rank] = _plain_loop(rank, port, loop)


def _loop_args(name: str, warmup: int, steps: int) -> LoopArgs:
    cfg = WORKLOADS[name]
    return LoopArgs(WORKERS, name, cfg["params"], cfg["batch"], warmup, steps)


def _throughput(name: str, steps: int, windows: list[float]) -> float:
    """Global batch x steps over the slowest rank's window, as the platform's row has it."""
    return WORKLOADS[name]["batch"] * WORKERS * steps / max(windows)


def plain_throughput(name: str, warmup: int, steps: int) -> float:
    manager = mp.Manager()
    out = manager.dict()
    loop = _loop_args(name, warmup, steps)
    mp.spawn(_plain_worker, args=(free_port(), loop, out), nprocs=WORKERS)
    windows = list(out.values())
    manager.shutdown()
    return _throughput(name, steps, windows)


class _PlainActor:
    """A Ray actor that runs one rank of the plain loop in its own (Ray worker) process."""

    def run(self, rank: int, port: int, loop: LoopArgs) -> float:
        return _plain_loop(rank, port, loop)


def plain_on_ray_throughput(name: str, warmup: int, steps: int) -> float:
    import ray

    # Fresh actors per run, as the platform starts a fresh worker group per sweep.
    actor = ray.remote(_PlainActor).options(num_cpus=CPUS_PER_DEVICE)
    actors = [actor.remote() for _ in range(WORKERS)]
    port, loop = free_port(), _loop_args(name, warmup, steps)
    try:
        windows = ray.get([a.run.remote(rank, port, loop) for rank, a in enumerate(actors)])
        return _throughput(name, steps, windows)
    finally:
        for a in actors:
            ray.kill(a)


def platform_throughput(
    name: str, warmup: int, steps: int, runs_dir: Path, source: str = "ray_data"
) -> float:
    from amdahl import run_sweep, validate_spec

    cfg = WORKLOADS[name]
    source, _, workers = source.partition(":")  # "torch_loader:0": its data_workers
    spec = validate_spec(
        {
            "name": f"overhead-{name}",
            "workload": name,
            "params": cfg["params"],
            "train": {"steps": steps, "warmup_steps": warmup},
            "grid": {
                "devices": [WORKERS],
                "batch_size": [cfg["batch"]],
                "sync": ["ddp"],
                "input": [source],
                "data_workers": [int(workers or 1)],
            },
            "resources": {
                "cpus_per_device": CPUS_PER_DEVICE,
                "cpus_per_data_worker": CPUS_PER_DATA_WORKER,
            },
        }
    )
    outcome = run_sweep(spec, runs_dir=runs_dir, tracking=False)
    (row,) = outcome.rows
    assert row["status"] == "ok", row["error"]
    if row.get("torch_threads") not in (None, THREADS):
        threads = row["torch_threads"]
        print(f"  note: the platform ran {threads} torch threads, the plain arms {THREADS}")
    return row["throughput"]


def main() -> None:
    global WORKERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=6, help="a multiple of the arm count rotates evenly"
    )
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="devices per arm (1: the one-device arm)"
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated, e.g. mlp"
    )
    parser.add_argument("--steps", type=int, default=None, help="default: per workload")
    parser.add_argument("--warmup", type=int, default=20)
    add_smoke_flag(parser)
    parser.add_argument(
        "--inputs",
        default="ray_data",
        help="the platform arm's input pipelines, one arm each (ray_data,torch_loader: is the "
        "platform's cost its input?)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.warmup, args.workloads = 1, 5, 2, "mlp"
    WORKERS = args.workers  # every arm reads it (the spawned ranks get it as an argument)
    workloads = {name: WORKLOADS[name] for name in args.workloads.split(",")}

    import ray

    work = Path(tempfile.mkdtemp(prefix="amdahl-bench-"))
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    arms = {}
    for i, source in enumerate(args.inputs.split(",")):
        arms["platform" if i == 0 else f"platform[{source}]"] = lambda name, steps, source=source: (
            platform_throughput(name, args.warmup, steps, work, source)
        )
    arms["plain-on-ray"] = lambda name, steps: plain_on_ray_throughput(name, args.warmup, steps)
    arms["plain"] = lambda name, steps: plain_throughput(name, args.warmup, steps)
    names = tuple(arms)
    # samples/s per workload, arm and round
    runs: dict[str, dict[str, list[float]]] = {n: {a: [] for a in names} for n in workloads}
    for r in range(args.rounds):
        order = rotated(names, r)
        for name, cfg in workloads.items():
            steps = args.steps or cfg["steps"]
            got = {arm: arms[arm](name, steps) for arm in order}
            for arm, value in got.items():
                runs[name][arm].append(value)
            print(
                f"round {r} {name}: "
                + ", ".join(f"{arm} {got[arm]:,.0f} samples/s" for arm in names),
                flush=True,
            )
    ray.shutdown()

    print_stamp()
    print(
        f"\n{WORKERS} worker(s); median over {args.rounds} round(s) of the per-round ratios "
        "(min, max):"
    )
    ratios = [
        ("platform / plain-on-ray", "platform", "plain-on-ray", "amdahl's own cost; goal >= 0.97"),
        ("plain-on-ray / plain", "plain-on-ray", "plain", "Ray's cost"),
        ("platform / plain", "platform", "plain", "goal >= 0.95 on the 2-core box"),
    ]
    for arm in names[1:-2]:  # the platform on each other input
        ratios.append((f"{arm} / plain-on-ray", arm, "plain-on-ray", "the same, on that input"))
    for name, arm_runs in runs.items():
        for label, a, b, note in ratios:
            values = paired(arm_runs[a], arm_runs[b], operator.truediv)
            print(f"{name}: {label:24s} {values.min_max()}  [{note}]")


if __name__ == "__main__":
    main()
