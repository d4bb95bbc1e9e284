"""What does the harness's timed loop itself cost? `run_trial` against a plain loop, one process.

No Ray, no other process: one rank (a one-rank gloo group, DDP-wrapped as a `ddp` trial at one
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
Prints the median and range of the per-round ratios harness / plain. What is left between
this ratio and harness_overhead.py's platform / plain-on-ray is Ray's and the input's (Ray
Train's worker, Ray Data's prefetching), not the loop's.

    python benchmarks/loop_overhead.py [--rounds N (5)] [--steps N (2000)] [--batch N (256)]
        [--ablate]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist
from harness_overhead import ddp_loop

from amdahl.data.storage import ROWS_PER_BLOCK, arrow_column
from amdahl.worker import trial as trial_module
from amdahl.worker.input import LocalShard
from amdahl.worker.trial import Placement, run_trial
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
            workload,
            trial,
            launch,
            LocalShard(blocks, 0.0),
            val,
            Placement(torch.device("cpu"), 0, 1),
        )
    finally:
        trial_module.UtilisationSampler, trial_module.clock_for = sampler, clock
    return batch * stats["measured_steps"] / stats["window_s"]


def plain(workload: MLP, batch: int, steps: int) -> float:
    """harness_overhead.py's plain loop, on this process's one-rank group."""
    return ddp_loop(0, 1, "mlp", workload.params, batch, WARMUP, steps)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--ablate", action="store_true", help="also the ablated harness arms")
    args = parser.parse_args()
    assert ROWS_PER_BLOCK % args.batch == 0, "a batch that divides a block: no joined batches"
    workload = MLP()
    one_rank_group("gloo")
    arms = ["harness", "plain"]
    if args.ablate:
        arms += ["harness-no-sampler", "harness-bare"]
    runs: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            if arm == "plain":
                runs[arm].append(plain(workload, args.batch, args.steps))
            else:
                runs[arm].append(harness(workload, args.batch, args.steps, arm))
        print(
            f"round {r}: " + ", ".join(f"{a} {runs[a][-1]:,.0f} samples/s" for a in arms),
            flush=True,
        )
    dist.destroy_process_group()
    print(f"\nmedian over {args.rounds} rounds of the per-round ratios (min, max):")
    for arm in arms:
        if arm == "plain":
            continue
        ratios = [a / b for a, b in zip(runs[arm], runs["plain"], strict=True)]
        print(
            f"{arm} / plain: {statistics.median(ratios):.3f} "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
