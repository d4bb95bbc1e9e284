"""What the closing calibration costs, and does its shorter measurement fit the same link?

A first sweep on a cluster shape ends with the all-reduce calibration (driver/measurement.py,
`calibrate`); its seconds are most of what that sweep spends beyond Ray's own launch floor
(benchmarks/launch_floor.py). Two arms, in interleaved rounds whose order rotates, on 2 gloo
ranks over 127.0.0.1 (torch.multiprocessing, no Ray: the measurement alone):

  shipped    what a sweep runs: `message_sizes(CPU_MAX_BYTES)` and `measure_all_reduce` as
             they are (5 rounds per size, the iteration count re-read after the first round)
  thorough   a reference three times as long: every power of 4 below 1 MiB (the sizes
             before 2026-11-28), 9 rounds of 0.05 s per size

Per round it prints each arm's seconds and its fitted alpha and bandwidth
(analysis.alphabeta.fit_alpha_beta), and at the end the medians, shipped / thorough for
seconds, alpha and bandwidth. Nothing is asserted.

    python benchmarks/calibration_cost.py [--rounds N (default 6)] [--smoke]

Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _harness import add_smoke_flag, free_port, paired, print_stamp, rotated

WORLD = 2


def _arm(rank: int, port: int, arm: str, out: dict) -> None:
    from amdahl.analysis.alphabeta import fit_alpha_beta
    from amdahl.driver.calibrate import CPU_MAX_BYTES
    from amdahl.protocol.items import message_sizes
    from amdahl.worker import calibration_measurement as cm

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    sizes = message_sizes(CPU_MAX_BYTES)
    if arm == "thorough":
        sizes = sorted({4**k for k in range(1, 10)} | {s for s in sizes if s >= 2**20})
        cm._ROUNDS, cm._ROUND_S, cm._LATENCY_ROUND_S = 9, 0.05, 0.05
    dist.barrier()
    t0 = time.perf_counter()
    points = cm.measure_all_reduce(sizes, torch.device("cpu"))
    seconds = time.perf_counter() - t0
    if rank == 0:
        fit = fit_alpha_beta(WORLD, [p["bytes"] for p in points], [p["seconds"] for p in points])
        out["result"] = (seconds, fit.alpha_s, fit.bandwidth_Bps)
    dist.barrier()
    dist.destroy_process_group()


def run(arm: str) -> tuple[float, float, float]:
    out = mp.Manager().dict()
    mp.spawn(_arm, args=(free_port(), arm, out), nprocs=WORLD)
    return out["result"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    arms = ("shipped", "thorough")
    got: dict[str, list[tuple[float, float, float]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm in rotated(arms, r):
            got[arm].append(run(arm))
        print(
            f"round {r}: "
            + "; ".join(
                f"{a} {got[a][-1][0]:.2f} s, alpha {got[a][-1][1] * 1e6:.0f} us, "
                f"bandwidth {got[a][-1][2] / 1e9:.2f} GB/s"
                for a in arms
            ),
            flush=True,
        )
    print_stamp()
    for i, what in enumerate(("seconds", "alpha", "bandwidth")):
        shipped, thorough = ([x[i] for x in got[a]] for a in arms)
        ratio = paired(shipped, thorough, operator.truediv)
        print(
            f"{what:9s}: shipped {statistics.median(shipped):.3g}, thorough "
            f"{statistics.median(thorough):.3g}; shipped / thorough per round "
            f"{ratio.min_max('.2f')}"
        )


if __name__ == "__main__":
    main()
