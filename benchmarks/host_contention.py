"""How one rank's CPU work slows as more ranks share the host: q processes, one torch thread
each (as a CPU rank runs), time the same matmuls at once, for q = 1, 2, 4, ... up to the host's
cores. Each process's rate against one process alone is the in-core slowdown the step-time
model can only copy from the nearest measured device count (analysis/contention.py): memory
bandwidth, shared caches, clocks, and two hardware threads on one core all show here, while the
processes never queue for a core (q <= cores). It prints the host's topology too (hardware
threads per core), since 16 "cores" of 8 physical ones would explain the 1.3-1.5x compute
slowdown measured from 8 CPU ranks up on the H200's host (docs/performance-history.md, GPU section).

    python benchmarks/host_contention.py [--counts 1,2,4,8,12,16] [--size 256] [--seconds 3]

The matmul is the D2L MLP's at batch 256 by default (256 x 512 by 512 x 256, fp32). Nothing is
asserted; the median rate per process and its slowdown are printed per count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from _harness import add_smoke_flag, print_stamp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = len(os.sched_getaffinity(0))
    default = ",".join(str(q) for q in (1, 2, 4, 8, 12, 16, 24, 32) if q <= cores)
    ap.add_argument("--counts", default=default, help="processes at once (default: up to cores)")
    ap.add_argument("--size", type=int, default=256, help="rows of the left matrix (the batch)")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per count")
    add_smoke_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.counts, args.size, args.seconds = "1", 32, 0.2
    print_stamp()
    print(topology())
    counts = [int(q) for q in args.counts.split(",")]
    ctx = mp.get_context("spawn")
    alone = None
    head = ("procs", "GFLOP/s each (median)", "min", "slowdown", "total")
    print(" ".join(f"{h:>{w}s}" for h, w in zip(head, (5, 22, 7, 9, 8), strict=True)))
    for q in counts:
        rates = run_at_once(ctx, q, args.size, args.seconds)
        med = statistics.median(rates)
        alone = alone or med
        print(
            f"{q:5d} {med:22.1f} {min(rates):7.1f} {alone / med:9.2f}x {sum(rates):8.1f}",
            flush=True,
        )


def run_at_once(ctx, q: int, size: int, seconds: float) -> list[float]:
    """q processes start their timed loop together (a barrier) and report GFLOP/s each."""
    barrier, results = ctx.Barrier(q), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(barrier, results, size, seconds)) for _ in range(q)]
    for p in procs:
        p.start()
    rates = [results.get() for _ in procs]
    for p in procs:
        p.join()
    return rates


def _worker(barrier, results, size: int, seconds: float) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(size, 512), torch.randn(512, 256)
    for _ in range(20):  # warm the allocator and the kernel choice
        a @ b
    barrier.wait()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    elapsed = time.perf_counter() - start
    results.put(2 * size * 512 * 256 * n / elapsed / 1e9)


def topology() -> str:
    """Logical CPUs this process may use, and how many distinct physical cores they are on."""
    cpus = sorted(os.sched_getaffinity(0))
    cores = set()
    for c in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            core = (base / "core_id").read_text().strip()
            package = (base / "physical_package_id").read_text().strip()
        except OSError:
            return f"{len(cpus)} logical CPUs (topology not readable)"
        cores.add((package, core))
    per = len(cpus) / len(cores) if cores else 1
    return f"{len(cpus)} logical CPUs on {len(cores)} physical cores ({per:g} threads each)"


if __name__ == "__main__":
    main()
