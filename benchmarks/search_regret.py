"""Does successive halving find the fastest configuration for a fraction of the grid's cost?

Runs, in one process on one local Ray, the same space as a grid and as a halving search, in
rounds whose order alternates (grid first in even rounds, halving first in odd ones, so neither
always runs on a fresher box):
  grid      every configuration for train.steps (search.method grid)
  halving   search.method halving: rungs of min_steps x eta^r steps over the survivors, the
            step-time model (search.calibration: auto, measured in the search's own worker
            group) skipping configurations predicted far behind; a promoted configuration continues
            its trial from the rung before (search.continue_rungs, the default)
  restart   (--restart-arm) the same search with continue_rungs: false, every rung starting
            its configurations again: what continuation saves, timed the same way
For each round it prints both sweeps' costs three ways: the span of their trial rows (the first
row's start to the last row's end: what the search itself changes), the whole wall time a user
waits (Ray's start, the worker group's start before the first measured window and the
calibrations inside), and those two parts apart. Where halving picks the grid's best
configuration it says "same configuration"; where it picks another, the two are measured again
side by side in one sweep (--repeats each, interleaved, medians: the grid's single measurements
of near-tied configurations differ between runs by more than their gap), and that ratio is the
pick's. Goals (issue 31, docs/performance.md): span ratio <= 0.40 at 90 steps and <= 0.25 at 300
on at least 24 distinct configurations; the pick >= 0.97 of the grid's best re-measured.
Nothing is asserted.

The space: the D2L MLP over devices x batch x sync x precision (24 configurations, each a
different computation on CPU: no axis that only changes what a GPU would see), sized to fit a
2-core laptop. Run it on a quiet machine.

    python benchmarks/search_regret.py [--steps N] [--min-steps N] [--eta N] [--rounds N]
                                       [--repeats N] [--final-repeats 1,3] [--restart-arm]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
from datetime import datetime
from pathlib import Path

from _harness import add_smoke_flag, print_stamp, rotated, spread

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
    },
    "resources": {"cpus_per_device": 0.5, "cpus_per_data_worker": 0.5},
    "tracking": {"enabled": False},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=90, help="train.steps of the grid")
    parser.add_argument("--min-steps", type=int, default=10)
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="grid/halving pairs")
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats of the side-by-side re-measurement"
    )
    parser.add_argument(
        "--final-repeats",
        default="1",
        help="search.final_repeats values, each a halving sweep against the same grid",
    )
    parser.add_argument(
        "--restart-arm",
        action="store_true",
        help="also run each halving search with search.continue_rungs false, side by side",
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.min_steps, args.repeats = 1, 9, 3, 1
        SPACE["train"]["warmup_steps"] = 2
        SPACE["grid"] = {k: v[:2] for k, v in SPACE["grid"].items()}

    import ray

    work = Path(tempfile.mkdtemp(prefix="amdahl-regret-"))
    SPACE["train"]["steps"] = args.steps
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    arms, specs = _arms(args)
    span_ratio: dict[str, list[float]] = {a: [] for a in arms[1:]}
    wall_ratio: dict[str, list[float]] = {a: [] for a in arms[1:]}
    pick_ratio: dict[str, list[float]] = {a: [] for a in arms[1:]}
    for r in range(args.rounds):
        order = rotated(arms, r)
        got = {arm: _sweep(specs[arm], work / f"{arm}-{r}") for arm in order}
        print(f"round {r} (order: {', '.join(order)}):", flush=True)
        for arm in arms:
            print("  " + _costs(arm, got[arm]), flush=True)
        grid = {x["trial_id"]: x for x in got["grid"]["rows"] if x["status"] == "ok"}
        best_id = max(grid, key=lambda t: grid[t]["throughput"])
        for arm in arms[1:]:
            out, rows = got[arm]["outcome"], got[arm]["rows"]
            span_ratio[arm].append(got[arm]["span"] / got["grid"]["span"])
            wall_ratio[arm].append(out.wall_s / got["grid"]["outcome"].wall_s)
            last = out.search.rungs[-1]
            pick_id = last.measured[0]
            per_rung = [
                sum(1 for x in rows if x["rung"] == k and x["status"] != "skipped")
                for k in sorted({x["rung"] for x in rows if x["rung"] is not None})
            ]
            skipped = sum(1 for x in rows if x["status"] == "skipped")
            continued = sum(1 for x in rows if x.get("continued_from"))
            if pick_id == best_id:
                pick_ratio[arm].append(1.0)
                verdict = "same configuration as the grid's best"
            else:
                remeasured = confirm(
                    [grid[best_id], grid[pick_id]], work / f"confirm-{arm}-{r}", args.repeats
                )
                pick_ratio[arm].append(remeasured[pick_id] / remeasured[best_id])
                verdict = (
                    f"another configuration: {pick_ratio[arm][-1]:.3f} of the grid's best, both "
                    f"re-measured side by side ({args.repeats} runs each)"
                )
            print(
                f"  {arm}: runs per rung {per_rung} ({continued} continued), skipped {skipped}, "
                f"{len(last.tied)} finalist(s) tied with its pick; pick: {verdict}; span "
                f"{span_ratio[arm][-1]:.3f} of the grid's, whole wall {wall_ratio[arm][-1]:.3f}",
                flush=True,
            )
    ray.shutdown()
    print_stamp()
    configurations = len(list(itertools.product(*SPACE["grid"].values())))
    print(
        f"\n{configurations} configurations, {args.steps} steps; medians over {args.rounds} "
        "round(s) (min-max):"
    )
    for arm in arms[1:]:
        print(
            f"{arm}: span / grid's {_mid(span_ratio[arm])} (goal <= 0.40 at 90 steps, <= 0.25 "
            f"at 300); whole wall / grid's {_mid(wall_ratio[arm])}; pick / grid's best "
            f"{_mid(pick_ratio[arm])} (goal >= 0.97; 1 where it is the same configuration)"
        )

    for arm in arms[1:]:
        if arm.startswith("restart"):
            kept = f"halving{arm.removeprefix('restart')}"
            saved = [a / b for a, b in zip(span_ratio[kept], span_ratio[arm], strict=True)]
            walls = [a / b for a, b in zip(wall_ratio[kept], wall_ratio[arm], strict=True)]
            print(
                f"{kept} / {arm} (rungs continuing against rungs starting again): span "
                f"{_mid(saved)}, whole wall {_mid(walls)}"
            )


def _arms(args: argparse.Namespace) -> tuple[list[str], dict[str, dict]]:
    """The arms in order (the grid first) and each one's sweep: a halving search per
    --final-repeats value (and its restarting twin with --restart-arm)."""
    variants = [int(v) for v in args.final_repeats.split(",")]
    arms = ["grid", *(f"halving{v}" for v in variants)]
    specs = {"grid": SPACE}
    for v in variants:
        search = {
            "method": "halving",
            "min_steps": args.min_steps,
            "eta": args.eta,
            "final_repeats": v,
            # measured inside the search's own worker group, after rung 0's anchors: its
            # seconds are part of the halving sweep's wall time (shown apart below)
            "calibration": "auto",
        }
        specs[f"halving{v}"] = {**SPACE, "search": search}
        if args.restart_arm:
            arms.append(f"restart{v}")
            specs[f"restart{v}"] = {**SPACE, "search": {**search, "continue_rungs": False}}
    return arms, specs


def _mid(values: list[float]) -> str:
    return spread(values).text()


def _sweep(spec: dict, runs_dir: Path) -> dict:
    """One sweep: its outcome, rows, and the span of its trial rows (seconds)."""
    from amdahl import read_results, run_sweep, validate_spec

    outcome = run_sweep(validate_spec(spec), runs_dir=runs_dir)
    rows = read_results(outcome.sweep_dir).to_pylist()
    timed = [x for x in rows if x.get("started_at") and x["status"] != "skipped"]
    starts = [datetime.fromisoformat(x["started_at"]).timestamp() for x in timed]
    ends = [t + (x["wall_s"] or 0.0) for t, x in zip(starts, timed, strict=True)]
    return {"outcome": outcome, "rows": rows, "span": max(ends) - min(starts)}


def _costs(arm: str, got: dict) -> str:
    """A sweep's wall time in its parts: before the first measured window, the trial rows'
    span, and after it (the closing calibration, the report, the groups' ends)."""
    out = got["outcome"]
    first = out.first_measured_s or 0.0
    after = out.wall_s - first - got["span"]
    return (
        f"{arm}: {len(got['rows'])} rows; whole wall {out.wall_s:.1f} s = {first:.1f} s before "
        f"the first window (planning, data, {out.group_starts} worker-group start(s)) + the "
        f"trial rows' span {got['span']:.1f} s + {after:.1f} s after it; calibration "
        f"{out.calibration_s:.1f} s (halving: inside the span, after rung 0's anchors; grid: "
        "after it)"
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
