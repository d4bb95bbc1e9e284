"""What the per-step work a plain loop does not do costs, each piece against its absence.

One process, no Ray, one torch thread; every pair alternates its order each round and the
median of the per-round differences is printed with its range (microseconds):
  loss scaling      a tiny MLP's training step (hidden [8], batch 32, one-rank DDP over gloo)
                    with the loss divided by 1 and the kept loss multiplied back, as the loop
                    did at one micro-step, against the step without them (what
                    `worker.trial._Trial.backward` does now at one micro-step)
  disabled autocast entering and leaving `torch.autocast(enabled=False)`, as the loop did for
                    fp32, against `contextlib.nullcontext` (what `Precision.autocast` returns
                    now)
  batch cutting     `input.Rebatcher` cutting 256-row batches from 2048-row MLP chunks, against
                    the plain loop's own dict slicing of one batch from rows in memory

    python benchmarks/step_bookkeeping.py [--rounds N (6)] [--smoke]

docs/architecture.md, "What the loop costs beside a plain loop", cites these figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import operator
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _harness import add_smoke_flag, interleaved, paired, print_stamp, spread

from amdahl.worker.input import Rebatcher
from amdahl.workload import make_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trial_runner import one_rank_group  # noqa: E402


def _tiny_step(steps: int = 20_000) -> Callable[[bool], float]:
    """Runs `steps` tiny DDP steps, with or without the scalar ops; microseconds per step."""
    workload = make_workload("mlp", {"hidden": [8]})
    rows = {k: torch.from_numpy(v) for k, v in workload.generate("train", 16384, seed=0).items()}
    model = torch.nn.parallel.DistributedDataParallel(workload.build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def run(scaled: bool, batch: int = 32) -> float:
        kept = []
        start = time.perf_counter()
        for step in range(steps):
            i = (step * batch) % (16384 - batch)
            x, y = workload.split_batch({k: v[i : i + batch] for k, v in rows.items()})
            loss = workload.loss(model(x), y)
            if scaled:
                loss = loss / 1
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            kept.append(loss.detach() * 1 if scaled else loss.detach())
        return (time.perf_counter() - start) / steps * 1e6

    return run


def _context(disabled_autocast: bool, n: int = 200_000) -> float:
    start = time.perf_counter()
    for _ in range(n):
        if disabled_autocast:
            context = torch.autocast("cpu", dtype=None, enabled=False)
        else:
            context = contextlib.nullcontext()
        with context:
            pass
    return (time.perf_counter() - start) / n * 1e6


def _cutting(rebatcher: bool, n: int = 200_000, batch: int = 256) -> float:
    chunks = [{"x": torch.randn(2048, 512), "y": torch.arange(2048)} for _ in range(4)]
    if rebatcher:
        batches = Rebatcher(itertools.cycle(chunks), pin=False).batches(batch)
        start = time.perf_counter()
        for _ in range(n):
            next(batches)
    else:
        rows = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
        start = time.perf_counter()
        for step in range(n):
            i = (step * batch) % (8192 - batch)
            {k: v[i : i + batch] for k, v in rows.items()}
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    add_smoke_flag(parser)
    args = parser.parse_args()
    n = 200 if args.smoke else 200_000
    rounds = 1 if args.smoke else args.rounds
    torch.set_num_threads(1)
    one_rank_group("gloo")
    pairs = {
        "loss scaling (per step)": _tiny_step(20 if args.smoke else 20_000),
        "disabled autocast (per step)": functools.partial(_context, n=n),
        "batch cutting, Rebatcher - plain slicing (per batch)": functools.partial(_cutting, n=n),
    }
    print_stamp()
    for name, measure in pairs.items():
        runs = interleaved(
            {"without": lambda m=measure: m(False), "with": lambda m=measure: m(True)}, rounds
        )
        diffs = paired(runs["with"], runs["without"], operator.sub)
        print(
            f"{name}: {diffs.min_max('+.1f', ' us')}; with "
            f"{spread(runs['with']).median:.1f} us, without {spread(runs['without']).median:.1f} us"
        )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
