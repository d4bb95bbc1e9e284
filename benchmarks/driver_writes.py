"""Do the driver's writes (MLflow's child runs) take CPU from the measured windows?

A child run costs the driver ~0.1 s of CPU (SQLite, an insert per metric of its curves) on the
tracker's own thread. Written as each row arrives, it runs while the next trial's window is
open; on a 2-core box with two ranks the cores are full, so that CPU comes out of the window.
amdahl now holds the rows of short windows (under MIRROR_AT_ONCE_FROM_S, driver/measurement.py)
until the sweep stops measuring. This script runs, in one process on one local Ray, the same
short-window sweep three ways, in rounds whose order rotates:
  off       tracking off: no driver writes but results.parquet (the reference)
  at-once   MLflow on a fresh SQLite store, every row written as it arrives (the old way)
  held      the same store, short windows' rows written once measuring is over (the default)
and prints, per arm, each configuration's throughput over the same round's `off` arm (median
and range over configurations and rounds), its rows' slowest step over their median step
(median over rows: a write landing in a window shows as a slow step) and the whole wall time
of `run_sweep` (every write included) over `off`'s. Nothing is asserted; run it on a quiet
machine.

    python benchmarks/driver_writes.py [--rounds N] [--steps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _harness import add_smoke_flag, print_stamp, rotated, spread

SPACE = {
    "name": "writes",
    "workload": "mlp",
    # short windows (0.2-0.6 s), two ranks on two cores: a 0.1 s write is a large share of one
    "train": {"steps": 60, "warmup_steps": 10},
    "grid": {"devices": [2], "batch_size": [32, 64, 128, 256], "sync": ["ddp", "none"]},
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
}
ARMS = ("off", "at-once", "held")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three arms")
    parser.add_argument("--steps", type=int, default=60)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps = 1, 5
        SPACE["grid"] = {**SPACE["grid"], "batch_size": [32], "sync": ["ddp"]}

    import ray

    from amdahl.driver import measurement

    work = Path(tempfile.mkdtemp(prefix="amdahl-writes-"))
    SPACE["train"]["steps"] = args.steps
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ratios: dict[str, list[float]] = {a: [] for a in ARMS}
    spreads: dict[str, list[float]] = {a: [] for a in ARMS}
    walls: dict[str, list[float]] = {a: [] for a in ARMS}
    for r in range(args.rounds):
        order = rotated(ARMS, r)  # each arm first once in three rounds
        got = {}
        for arm in order:
            measurement.MIRROR_AT_ONCE_FROM_S = 0.0 if arm == "at-once" else 10.0
            got[arm] = _sweep(arm, work / f"{arm}-{r}")
        reference = got["off"]
        for arm in ARMS:
            ratios[arm] += got[arm]["ratio_of"](reference)
            spreads[arm] += [_spread(x) for x in got[arm]["rows"].values()]
            walls[arm].append(got[arm]["wall"] / reference["wall"])
        print(
            f"round {r} (order: {', '.join(order)}): "
            + "; ".join(
                f"{a} {statistics.median(got[a]['ratio_of'](reference)):.3f} "
                f"({got[a]['wall']:.0f} s)"
                for a in ARMS
            ),
            flush=True,
        )
    print_stamp()
    print(f"\n{len(ratios['off'])} configuration runs per arm ({args.rounds} rounds)")
    for arm in ARMS:
        values, wall = spread(ratios[arm]), spread(walls[arm])
        print(
            f"  {arm:10s} throughput / off: median {values.median:.3f} "
            f"(range {values.lo:.3f}-{values.hi:.3f}); slowest step / median step: "
            f"median {spread(spreads[arm]).median:.2f}; whole wall / off: median "
            f"{wall.median:.3f} (range {wall.lo:.3f}-{wall.hi:.3f})"
        )


def _sweep(arm: str, runs_dir: Path) -> dict:
    """One sweep of SPACE with `arm`'s tracking: its ok rows by trial id and its wall seconds."""
    from amdahl import read_results, run_sweep, validate_spec

    # a fresh store per sweep, through the variable that wins over tracking.uri
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{runs_dir}-mlflow.db"
    start = time.perf_counter()
    spec = validate_spec({**SPACE, "tracking": {"enabled": arm != "off"}})
    outcome = run_sweep(spec, runs_dir=runs_dir)
    wall = time.perf_counter() - start
    rows = {
        x["trial_id"]: x for x in read_results(outcome.sweep_dir).to_pylist() if x["status"] == "ok"
    }

    def ratio_of(reference: dict) -> list[float]:
        return [rows[t]["throughput"] / reference["rows"][t]["throughput"] for t in rows]

    return {"rows": rows, "wall": wall, "ratio_of": ratio_of}


def _spread(row: dict) -> float:
    """The row's slowest measured step over its median step (its own columns)."""
    return row["step_time_max_s"] / row["step_time_s"]


if __name__ == "__main__":
    main()
