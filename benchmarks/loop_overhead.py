"""What does the harness's timed loop itself cost? `run_trial` against a plain loop, one process.

One process: one rank (a one-rank gloo group, DDP-wrapped as a `ddp` trial at one
device is), the D2L MLP, the same per-device batch, torch threads, optimizer (SGD, momentum
0.9), warmup and measured steps, and the same rows in memory. Arms, their order rotating each
round:
  harness   `worker.trial.run_trial`, input through the ray_data path's own code for a static
            shard (`input.LocalShard` over block-sized Arrow tables of the rows), with
            its marks, feed, learning-rate schedule, utilisation sampler and everything after
            the window; throughput from its window, as the results row computes it
  plain     the loop of benchmarks/harness_overhead.py (`ddp_loop`) over the same rows as
            tensors
  harness-no-sampler / harness-bare (with --ablate): the harness with its utilisation
            sampler off, and with the sampler off and a no-op step clock, to show where a
            difference comes from
Prints the median and range of the per-round ratios harness / plain, and of the per-round
differences in microseconds per step (the harness's own per-step cost: `--hidden 8 --batch 32`,
a tiny MLP with ~0.6 ms steps, shows it best). `--in` says which process runs the rounds, both
arms always in the same one:
  process     this one, no Ray (the default)
  ray-actor   one Ray actor holding the CPUs a platform train worker holds
  ray-train   one Ray Train worker (a one-worker TorchTrainer), the process a platform trial's
              loop runs in, in Ray Train's training thread
Where harness / plain is at parity inside a Ray Train worker, what is left between
harness_overhead.py's platform / plain-on-ray is the process around the loop (Ray Train's
worker, Tune's trainable, the Train controller), not the loop.

    python benchmarks/loop_overhead.py [--rounds N (5)] [--steps N (2000)] [--batch N (256)]
        [--hidden 8 (the MLP's hidden widths, comma-separated; default D2L's 256,128)]
        [--ablate] [--in process|ray-actor|ray-train]
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist
from _harness import add_smoke_flag, paired, print_stamp, rotated
from harness_overhead import CPUS_PER_DEVICE, ddp_loop

from amdahl.data.storage import ROWS_PER_BLOCK, arrow_column
from amdahl.worker import trial as trial_module
from amdahl.worker.input import LocalShard
from amdahl.worker.trial import Placement, TrialRun, run_trial
from workloads.mlp import MLP

# The in-process trial configs the tests build (tests/trial_runner.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trial_runner import launch_config, one_rank_group, settings, trial_config  # noqa: E402

THREADS = 1
WARMUP = 20


def _rows(workload: MLP) -> dict:
    return workload.generate("train", workload.params["train_rows"], seed=0)


def harness(workload: MLP, batch: int, steps: int, variant: str) -> float:
    rows = _rows(workload)
    table = pa.table({k: arrow_column(v) for k, v in rows.items()})
    blocks = [table.slice(i, ROWS_PER_BLOCK) for i in range(0, len(table), ROWS_PER_BLOCK)]
    trial = trial_config(
        settings(params=workload.params, sync="ddp", input="ray_data"),
        batch_size=batch,
        per_device_batch=batch,
    )
    launch = launch_config((trial,), steps=WARMUP + steps, warmup_steps=WARMUP, profile_steps=0)
    val = {k: v[:512] for k, v in rows.items()}
    sampler, clock = trial_module.UtilisationSampler, trial_module.clock_for
    if variant in ("harness-no-sampler", "harness-bare"):
        trial_module.UtilisationSampler = _NoSampler
    if variant == "harness-bare":
        trial_module.clock_for = lambda _type: _NoClock()
    try:
        torch.set_num_threads(THREADS)
        stats = run_trial(
            TrialRun(
                workload,
                trial,
                launch,
                LocalShard(blocks, 0.0),
                val,
                Placement(torch.device("cpu"), 0, 1),
            )
        )
    finally:
        trial_module.UtilisationSampler, trial_module.clock_for = sampler, clock
    return batch * stats["measured_steps"] / stats["window_s"]


def plain(workload: MLP, batch: int, steps: int) -> float:
    """harness_overhead.py's plain loop, on this process's one-rank group: samples/s over its
    window."""
    return batch * steps / ddp_loop(0, 1, "mlp", workload.params, batch, WARMUP, steps)


class _NoSampler:
    def __init__(self, device: torch.device):
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def series(self) -> None:
        return None


class _NoClock:
    """A step clock whose marks cost nothing (every span reads 1 ms: figures are meaningless)."""

    on_device = False

    def mark(self) -> float:
        return 0.0

    def span(self, a: float, b: float) -> float:
        return 1e-3

    def synchronize(self) -> None:
        pass


def measure(
    rounds: int, steps: int, batch: int, arms: list[str], hidden: list[int]
) -> dict[str, list[float]]:
    """Every arm's samples/s per round, in this process, the arm order rotating each round, on
    the process group that is up (Ray Train's) or a one-rank gloo group of its own."""
    own_group = not dist.is_initialized()
    if own_group:
        one_rank_group("gloo")
    workload = MLP(hidden=hidden)
    runs: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(rounds):
        for arm in rotated(arms, r):
            if arm == "plain":
                runs[arm].append(plain(workload, batch, steps))
            else:
                runs[arm].append(harness(workload, batch, steps, arm))
    if own_group:
        dist.destroy_process_group()
    return runs


def _measure_here(here: str, *args) -> dict[str, list[float]]:
    """`measure` in a Ray worker, which has benchmarks/ on no path: run by value."""
    sys.path.insert(0, here)
    import loop_overhead

    return loop_overhead.measure(*args)


class _Runner:
    """The Ray actor of `--in ray-actor`."""

    def run(self, here: str, *args) -> dict[str, list[float]]:
        return _measure_here(here, *args)


def _train_fn(config: dict) -> None:
    # Ray Train V2 keeps reported metrics only with a checkpoint: the runs go to a file (a
    # local Ray: the driver's machine).
    runs = _measure_here(config["here"], *config["args"])
    Path(config["out"]).write_text(json.dumps(runs))


def measure_in_ray(where: str, *args) -> dict[str, list[float]]:
    """`measure` in one Ray actor or one Ray Train worker holding a platform train worker's
    CPUs (harness_overhead.CPUS_PER_DEVICE), on a local Ray (127.0.0.1 only)."""
    import ray

    here = str(Path(__file__).resolve().parent)
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        if where == "ray-actor":
            runner = ray.remote(_Runner).options(num_cpus=CPUS_PER_DEVICE).remote()
            return ray.get(runner.run.remote(here, *args))
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        work = Path(tempfile.mkdtemp(prefix="amdahl-bench-"))
        trainer = TorchTrainer(
            _train_fn,
            train_loop_config={"here": here, "args": list(args), "out": str(work / "runs.json")},
            scaling_config=ScalingConfig(
                num_workers=1, resources_per_worker={"CPU": CPUS_PER_DEVICE}
            ),
            run_config=RunConfig(storage_path=str(work)),
        )
        trainer.fit()
        return json.loads((work / "runs.json").read_text())
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", default="256,128", help="the MLP's hidden widths")
    parser.add_argument("--ablate", action="store_true", help="also the ablated harness arms")
    parser.add_argument(
        "--in", dest="where", choices=("process", "ray-actor", "ray-train"), default="process"
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.hidden = 1, 20, "8"
    assert ROWS_PER_BLOCK % args.batch == 0, "a batch that divides a block: no joined batches"
    arms = ["harness", "plain"]
    if args.ablate:
        arms += ["harness-no-sampler", "harness-bare"]
    hidden = [int(w) for w in args.hidden.split(",")]
    job = (args.rounds, args.steps, args.batch, arms, hidden)
    runs = measure(*job) if args.where == "process" else measure_in_ray(args.where, *job)
    for r in range(args.rounds):
        print(f"round {r}: " + ", ".join(f"{a} {runs[a][r]:,.0f} samples/s" for a in arms))
    print_stamp()
    print(f"\nin {args.where}: median over {args.rounds} rounds of the per-round ratios:")
    for arm in arms:
        if arm == "plain":
            continue
        ratios = paired(runs[arm], runs["plain"], operator.truediv)
        extra = paired(
            runs[arm], runs["plain"], lambda a, b: (args.batch / a - args.batch / b) * 1e6
        )
        print(
            f"{arm} / plain: {ratios.min_max()}; "
            f"{arm} - plain per step: {extra.min_max('+.1f', ' us')}"
        )


if __name__ == "__main__":
    main()
