"""Does successive halving find the fastest configuration for a fraction of the grid's cost?

Runs, in one process on one local Ray, the same space twice:
  grid      every configuration for train.steps (search.method grid)
  halving   search.method halving: rungs of min_steps x eta^r steps over the survivors, the
            step-time model (given a calibration.json measured first by `platform calibrate`)
            skipping configurations predicted far behind
and prints the regret ratio, best throughput found by halving / the grid's best (both read from
the grid's own measurements of those configurations, so that the ratio compares choices, not
two noisy measurements), the halving winner's own figure beside it, and the share of the grid's
trial-seconds (the rows' wall_s: what each trial cost inside its launch) that halving spent.
Where halving picked another configuration than the grid's best, both are measured again side by
side in one sweep (--repeats each, medians), and that ratio is printed too: the grid's single
measurements of near-tied configurations differ between runs by more than their gap.
Goal (issue 12): >= 0.95 of the best with <= 25% of the seconds. Nothing is asserted.

The space: the D2L MLP over devices x batch x sync x precision x prefetch (5 axes, 48
configurations), sized to fit a 2-core laptop. Run it on a quiet machine: the regret compares
one noisy measurement per configuration, and a loaded box moves a configuration's throughput by
tens of percent between the two sweeps.

    python benchmarks/search_regret.py [--steps N] [--min-steps N] [--eta N] [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

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
    args = parser.parse_args()

    import ray

    from amdahl import read_results, run_sweep, validate_spec
    from amdahl.calibrate import run_calibration

    work = Path(tempfile.mkdtemp(prefix="amdahl-regret-"))
    SPACE["train"]["steps"] = args.steps
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    calib_dir = work / "calibration"
    calib_dir.mkdir()
    (calib_dir / "spec.yaml").write_text(yaml.safe_dump(SPACE))
    started = time.perf_counter()
    run_calibration(2, calib_dir)  # alpha-beta of gloo here: the model's communication terms
    calibrate_s = time.perf_counter() - started
    halving = {
        **SPACE,
        "search": {
            "method": "halving",
            "min_steps": args.min_steps,
            "eta": args.eta,
            "calibration": str(calib_dir / "calibration.json"),
        },
    }
    ratios, confirmed, shares, with_calibration = [], [], [], []
    for r in range(args.rounds):
        grid_rows = read_results(
            run_sweep(validate_spec(SPACE), runs_dir=work / "grid").sweep_dir
        ).to_pylist()
        search_out = run_sweep(validate_spec(halving), runs_dir=work / "halving")
        search_rows = read_results(search_out.sweep_dir).to_pylist()

        grid = {x["trial_id"]: x for x in grid_rows if x["status"] == "ok"}
        best_id = max(grid, key=lambda t: grid[t]["throughput"])
        final = [x for x in search_rows if x["rung"] == max(y["rung"] or 0 for y in search_rows)]
        final = [x for x in final if x["status"] == "ok"]
        pick = max(final, key=lambda x: x["throughput"])
        grid_s = sum(x["wall_s"] or 0.0 for x in grid_rows)
        search_s = sum(x["wall_s"] or 0.0 for x in search_rows if x["status"] != "skipped")
        ratio = grid[pick["trial_id"]]["throughput"] / grid[best_id]["throughput"]
        ratios.append(ratio)
        if pick["trial_id"] == best_id:
            confirmed.append(1.0)
        else:
            confirmed.append(confirm(pick, grid[best_id], work / "confirm", args.repeats))
        shares.append(search_s / grid_s)
        with_calibration.append((search_s + calibrate_s) / grid_s)
        rungs = sorted({x["rung"] for x in search_rows if x["rung"] is not None})
        per_rung = [
            sum(1 for x in search_rows if x["rung"] == k and x["status"] != "skipped")
            for k in rungs
        ]
        skipped = sum(1 for x in search_rows if x["status"] == "skipped")
        print(
            f"round {r}: grid {len(grid_rows)} trials, {grid_s:.1f} trial-s, best "
            f"{grid[best_id]['throughput']:,.0f} samples/s; halving measured {per_rung} per "
            f"rung, skipped {skipped}, {search_s:.1f} trial-s; its pick: "
            f"{grid[pick['trial_id']]['throughput']:,.0f} in the grid "
            f"({pick['throughput']:,.0f} in its last rung); re-measured side by side, pick / "
            f"grid best {confirmed[-1]:.3f}",
            flush=True,
        )
    ray.shutdown()
    print(
        f"\nbest found / grid best: median {statistics.median(ratios):.3f} over "
        f"{len(ratios)} round(s) (goal >= 0.95), from the grid's single measurements\n"
        f"  re-measured side by side ({args.repeats} repeats each, medians): "
        f"{statistics.median(confirmed):.3f}\n"
        f"halving trial-seconds / grid trial-seconds: median {statistics.median(shares):.3f} "
        "(goal <= 0.25)\n"
        f"  counting the calibration's {calibrate_s:.1f} s too (measured once per cluster; "
        "`search.calibration: auto` measures it in the sweep): "
        f"{statistics.median(with_calibration):.3f}"
    )


def confirm(pick: dict, best: dict, runs_dir: Path, repeats: int) -> float:
    """The pick's throughput over the grid best's, both measured again in one sweep (one launch,
    `repeats` each, medians): the grid's single measurements of near-tied configurations
    differ by more than their gap between runs here, so its ranking alone cannot say which
    choice was worse."""
    from amdahl import read_results, run_sweep, validate_spec

    axes = list(SPACE["grid"])
    chosen = [{a: row[a] for a in axes} for row in (pick, best)]
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

    def median(target: dict) -> float:
        return statistics.median(
            r["throughput"]
            for r in rows
            if r["status"] == "ok" and all(r[a] == target[a] for a in axes)
        )

    return median(chosen[0]) / median(chosen[1])


if __name__ == "__main__":
    main()
