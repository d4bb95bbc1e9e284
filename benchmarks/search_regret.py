"""Does successive halving find the fastest configuration for a fraction of the grid's cost?

Runs, in one process on one local Ray, the same space twice:
  grid      every configuration for train.steps (search.method grid)
  halving   search.method halving: rungs of min_steps x eta^r steps over the survivors, the
            step-time model (search.calibration: auto, measured in the search's own worker
            group) skipping configurations predicted far behind
and prints the regret ratio, best throughput found by halving / the grid's best (both read from
the grid's own measurements of those configurations, so that the ratio compares choices, not
two noisy measurements), the halving winner's own figure beside it, and the share of the grid's
trial-seconds (the rows' wall_s: what each trial cost inside its launch) that halving spent.
The grid's best and every halving pick are then measured again side by side in one sweep
(--repeats each, interleaved, medians), and that ratio is printed too: the grid's single
measurements of near-tied configurations differ between runs by more than their gap.
Halving runs once per --final-repeats value (search.final_repeats: measurements of each
finalist in the last rung) against the same grid, so their cost and pick compare side by side.
Both costs are printed: trial-seconds, and the wall seconds a user waits (every launch start,
and the calibration the model used, inside). Goals (docs/architecture.md): the pick >= 0.97 of
the grid's best re-measured; halving wall / grid wall <= 0.40 at 90 steps, <= 0.30 at 300.
Nothing is asserted.

The space: the D2L MLP over devices x batch x sync x precision x prefetch (5 axes, 48
configurations), sized to fit a 2-core laptop. Run it on a quiet machine: the regret compares
one noisy measurement per configuration, and a loaded box moves a configuration's throughput by
tens of percent between the two sweeps.

    python benchmarks/search_regret.py [--steps N] [--min-steps N] [--eta N] [--rounds N]
                                       [--repeats N] [--final-repeats 1,3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
from pathlib import Path

SPACE = {
    "name": "regret",
    "workload": "mlp",
    "train": {"steps": 90, "warmup_steps": 10},
    "grid": {
        "devices": [1, 2],
        "batch_size": [32, 128, 512],
        # not `none`: at 2 devices it is the no-communication ceiling, not a way to train
        "sync": ["ddp", "ddp_fp16"],
        "precision": ["fp32", "bf16"],
        "prefetch_batches": [1, 4],
    },
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=90, help="train.steps of the grid")
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="grid/halving pairs")
    parser.add_argument(
        "--repeats", type=int, default=4, help="repeats of the side-by-side re-measurement"
    )
    parser.add_argument(
        "--final-repeats",
        default="1,3",
        help="search.final_repeats values, each a halving run against the same grid",
    )
    args = parser.parse_args()

    import ray

    from amdahl import read_results, run_sweep, validate_spec

    work = Path(tempfile.mkdtemp(prefix="amdahl-regret-"))
    SPACE["train"]["steps"] = args.steps
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    variants = [int(v) for v in args.final_repeats.split(",")]
    halving = {
        **SPACE,
        "search": {
            "method": "halving",
            "min_steps": args.min_steps,
            "eta": args.eta,
            # measured inside the search's own worker group, after rung 0's anchors: its
            # seconds are part of the halving sweep's wall time
            "calibration": "auto",
        },
    }
    ratios: dict[int, list[float]] = {v: [] for v in variants}
    confirmed: dict[int, list[float]] = {v: [] for v in variants}
    shares: dict[int, list[float]] = {v: [] for v in variants}
    walls: dict[int, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        grid_out = run_sweep(validate_spec(SPACE), runs_dir=work / "grid")
        grid_rows = read_results(grid_out.sweep_dir).to_pylist()
        grid = {x["trial_id"]: x for x in grid_rows if x["status"] == "ok"}
        best_id = max(grid, key=lambda t: grid[t]["throughput"])
        grid_s = sum(x["wall_s"] or 0.0 for x in grid_rows)
        print(
            f"round {r}: grid {len(grid_rows)} trials, {grid_s:.1f} trial-s, best "
            f"{grid[best_id]['throughput']:,.0f} samples/s, {grid_out.wall_s:.0f} s of wall time",
            flush=True,
        )
        picks = {}
        for v in variants:
            spec = {**halving, "search": {**halving["search"], "final_repeats": v}}
            out = run_sweep(validate_spec(spec), runs_dir=work / f"halving-final{v}")
            rows = read_results(out.sweep_dir).to_pylist()
            pick_id = out.search.rungs[-1].measured[0]
            picks[v] = grid[pick_id]
            spent = sum(x["wall_s"] or 0.0 for x in rows if x["status"] != "skipped")
            shares[v].append(spent / grid_s)
            # What the user waits for: the whole sweep, launch starts and the calibration
            # included.
            walls[v].append(out.wall_s / grid_out.wall_s)
            ratios[v].append(grid[pick_id]["throughput"] / grid[best_id]["throughput"])
            rungs = sorted({x["rung"] for x in rows if x["rung"] is not None})
            per_rung = [
                sum(1 for x in rows if x["rung"] == k and x["status"] != "skipped") for k in rungs
            ]
            skipped = sum(1 for x in rows if x["status"] == "skipped")
            print(
                f"  halving, final_repeats {v}: runs per rung {per_rung}, skipped {skipped}, "
                f"{spent:.1f} trial-s ({shares[v][-1]:.3f} of the grid's); pick "
                f"{grid[pick_id]['throughput']:,.0f} in the grid "
                f"({out.search.rungs[-1].values[pick_id]:,.0f} in its last rung), "
                f"{len(out.search.rungs[-1].tied)} finalist(s) tied with it; {out.wall_s:.0f} s "
                f"of wall time with {out.group_starts} worker-group start(s) (grid: "
                f"{grid_out.group_starts}), {walls[v][-1]:.3f} of the grid's",
                flush=True,
            )
        remeasured = confirm([grid[best_id], *picks.values()], work / "confirm", args.repeats)
        for v in variants:
            confirmed[v].append(remeasured[picks[v]["trial_id"]] / remeasured[best_id])
        print(
            "  re-measured side by side, pick / grid best: "
            + ", ".join(f"final_repeats {v}: {confirmed[v][-1]:.3f}" for v in variants),
            flush=True,
        )
    ray.shutdown()
    print(f"\nmedians over {args.rounds} round(s)")
    for v in variants:
        print(
            f"final_repeats {v}: best found / grid best {statistics.median(ratios[v]):.3f} from "
            f"the grid's single measurements, {statistics.median(confirmed[v]):.3f} re-measured "
            f"side by side (goal >= 0.97); trial-seconds / grid's "
            f"{statistics.median(shares[v]):.3f}; wall seconds / grid's "
            f"{statistics.median(walls[v]):.3f} (launch starts and calibration in it; goal "
            "<= 0.40 at 90 steps, <= 0.30 at 300)"
        )


def confirm(chosen_rows: list[dict], runs_dir: Path, repeats: int) -> dict[str, float]:
    """Median throughput per trial id of the given grid rows' configurations, measured again in
    one sweep (`repeats` each, interleaved): the grid's single measurements of near-tied
    configurations differ by more than their gap between runs here, so its ranking alone
    cannot say which choice was worse."""
    from amdahl import read_results, run_sweep, validate_spec

    axes = list(SPACE["grid"])
    chosen = [{a: row[a] for a in axes} for row in chosen_rows]
    grid = {a: sorted({c[a] for c in chosen}) for a in axes}
    exclude = [
        dict(zip(axes, combo, strict=True))
        for combo in itertools.product(*grid.values())
        if dict(zip(axes, combo, strict=True)) not in chosen
    ]
    spec = {
        **SPACE,
        "name": "confirm",
        "train": {**SPACE["train"], "repeats": repeats},
        "grid": grid,
        "exclude": exclude,
    }
    rows = read_results(run_sweep(validate_spec(spec), runs_dir=runs_dir).sweep_dir).to_pylist()
    out = {}
    for row in chosen_rows:
        out[row["trial_id"]] = statistics.median(
            r["throughput"]
            for r in rows
            if r["status"] == "ok" and all(r[a] == row[a] for a in axes)
        )
    return out


if __name__ == "__main__":
    main()
