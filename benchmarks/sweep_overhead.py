"""Where a sweep's wall time goes: measured steps vs orchestration, grouped vs raw launches.

Two workload modes, each one sweep run in one process on one local Ray, interleaved:
  mlp         sweeps/laptop.yaml (or the SPEC given): the MLP, rows fed as per-rank shards
              (no preprocessing)
  preprocess  sweeps/preprocess_overhead.yaml: ResNet-18 with augmentation in `preprocess`
              (Ray Data map tasks) and a `params.width` axis the preprocessing does not read
and, per workload mode, the modes:
  grouped      the platform: trials sharing a worker-group shape (and input) run in one
               TorchTrainer; on one node, without preprocessing, one worker group serves every
               device count (worlds.py)
  by-devices   one worker group per device count (the grouping before worlds.py); left out
               where the plan cannot share across device counts anyway (a preprocessing
               workload: then it is grouped)
  raw          the raw Tune+Train pattern: a Tune function trainable fits one TorchTrainer
               per trial (same harness, same trials)
  no-tracking  grouped, with the MLflow mirror off
It prints per mode sweep efficiency = seconds inside measured steps / sweep wall seconds,
orchestration seconds per trial = (wall - measured) / trials, the launches the sweep used (its
rows' launch_id) and the median `first_step_s` of each launch's first trial vs its other
trials (a launch whose input pipeline starts inside its first trial shows it there); then
throughput ratios over the same trials: tracking on / off, and grouped / by-devices (a trial
on fewer devices than its worker group must measure what a group of its own would: the ratio
should be 1 within noise). Goals (docs/architecture.md, "Performance goals") are printed beside
the figures. Ratios are measured side by side in one run; nothing is asserted.

Rounds (3 by default, at least 3 for a spread): each round runs every mode once, and the order
rotates by one mode per round (grouped, by-devices, no-tracking; then by-devices, no-tracking,
grouped; ...), so that no mode always runs first on a cold machine or last on a warm one. A
ratio is taken per round, between the two modes of that round (the median over the trials
both measured), and printed as the median and range of those per-round ratios, beside the
median over all trial pairs.

    python benchmarks/sweep_overhead.py [SPEC] [--workload-mode mlp|preprocess|both]
        [--rounds N] [--skip-raw] [--modes grouped,no-tracking] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _harness import add_smoke_flag, print_stamp, rotated, spread

ROOT = Path(__file__).resolve().parents[1]
SPECS = {
    "mlp": ROOT / "sweeps" / "laptop.yaml",
    "preprocess": ROOT / "sweeps" / "preprocess_overhead.yaml",
}
#: (efficiency at least, orchestration seconds per trial at most), docs/architecture.md
#: "Performance goals".
GOALS = {"mlp": (0.75, 2.0), "preprocess": (0.6, 3.0)}
MODES = {
    "grouped": {"worker_groups": "per_shape", "tracking": True},
    "by-devices": {"worker_groups": "per_device_count", "tracking": True},
    "raw": {"worker_groups": "per_trial", "tracking": True},
    "no-tracking": {"worker_groups": "per_shape", "tracking": False},
}
#: Steps of the untimed warm-up sweep: enough to store the training set and warm imports.
WARMUP_STEPS = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(SPECS["mlp"]), help="the mlp mode's sweep")
    parser.add_argument("--workload-mode", choices=("mlp", "preprocess", "both"), default="both")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, each mode once per round (at least 3)"
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated subset of {', '.join(MODES)} (default: all)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="applied to every sweep"
    )
    parser.add_argument(
        "--skip-raw",
        action="store_true",
        help="leave out raw (more rounds of the other modes in the same time)",
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.modes, args.workload_mode = 1, "grouped", "mlp"
        args.overrides = [*args.overrides, "train.steps=5"]
    elif args.rounds < 3:
        parser.error("--rounds must be at least 3: a spread needs three per-round ratios")
    wanted = _modes(parser, args.modes)

    import ray

    from amdahl import load_spec, run_sweep

    work = Path(tempfile.mkdtemp(prefix="amdahl-bench-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    paths = {**SPECS, "mlp": Path(args.spec)}
    kinds = ("mlp", "preprocess") if args.workload_mode == "both" else (args.workload_mode,)
    specs = {kind: load_spec(paths[kind], args.overrides) for kind in kinds}
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    modes: dict[str, dict[str, dict]] = {}
    for kind in list(specs):
        # One untimed, short sweep first: the training set gets generated and stored, imports
        # warm up; its plan says whether by-devices differs from grouped.
        warm = load_spec(paths[kind], [*args.overrides, f"train.steps={WARMUP_STEPS}"])
        try:
            plan = run_sweep(warm, runs_dir=work / kind / "warmup", tracking=False).plan
        except Exception as e:  # noqa: BLE001 - report it and go on with the other mode
            print(f"[{kind}] warm-up sweep failed: {type(e).__name__}: {e}", flush=True)
            del specs[kind]
            continue
        modes[kind] = {
            m: kw
            for m, kw in MODES.items()
            if m in wanted
            and not (m == "raw" and args.skip_raw)
            and not (m == "by-devices" and not plan.shares_across_devices)
        }
    results = {kind: {m: [] for m in modes[kind]} for kind in specs}
    for r in range(args.rounds):
        for kind, spec in specs.items():
            for mode in rotated(list(modes[kind]), r):
                run = _run(run_sweep, spec, work / kind / mode, modes[kind][mode])
                if run is not None:
                    results[kind][mode].append({**run, "round": r})
                    print(
                        f"round {r} {kind:10s} {mode:12s} wall {run['wall']:6.1f} s, "
                        f"measured {run['measured']:6.1f} s, {run['trials']} trials "
                        f"({run['failed']} not ok), {run['launches']} launches",
                        flush=True,
                    )
                else:
                    print(f"round {r} {kind:10s} {mode:12s} FAILED (above)", flush=True)
    ray.shutdown()

    print_stamp()
    for kind in specs:
        _print_summary(kind, specs[kind].name, results[kind], args.rounds)


def _modes(parser: argparse.ArgumentParser, modes: str) -> list[str]:
    """--modes as a list, every name one of MODES (else the parser's error)."""
    wanted = [m for m in modes.split(",") if m]
    unknown = sorted(set(wanted) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; one of {', '.join(MODES)}")
    return wanted


def _run(run_sweep, spec, runs_dir: Path, kwargs: dict) -> dict | None:
    """One timed sweep -> its figures, or None (the error printed) if the sweep raised."""
    start = time.perf_counter()
    try:
        outcome = run_sweep(
            spec,
            runs_dir=runs_dir,
            tracking=kwargs["tracking"],
            worker_groups=kwargs["worker_groups"],
        )
    except Exception as e:  # noqa: BLE001 - report it and go on with the other modes
        print(f"{spec.name} {kwargs}: {type(e).__name__}: {e}", flush=True)
        return None
    wall = time.perf_counter() - start
    rows = outcome.rows
    by_launch: dict[str, list[dict]] = {}
    for row in rows:
        by_launch.setdefault(row.get("launch_id") or "?", []).append(row)
    first, later = [], []
    for launch_rows in by_launch.values():
        ordered = sorted(launch_rows, key=lambda row: row.get("started_at") or "")
        steps = [row.get("first_step_s") for row in ordered]
        if steps[0] is not None:
            first.append(steps[0])
        later += [s for s in steps[1:] if s is not None]
    return {
        "wall": wall,
        "measured": sum(row.get("measured_s") or 0.0 for row in rows),
        "trials": len(rows),
        "failed": sum(row.get("status") != "ok" for row in rows),
        "launches": len(by_launch),
        "first_step_first": first,
        "first_step_later": later,
        "throughput": {row["trial_id"]: row.get("throughput") for row in rows},
    }


def _median(values: list[float], fmt: str) -> str:
    got = spread(values)
    return format(got.median, fmt) if got.n else "n/a"


def _print_summary(kind: str, name: str, results: dict[str, list[dict]], rounds: int) -> None:
    eff_goal, per_goal = GOALS[kind]
    trials = next((runs[0]["trials"] for runs in results.values() if runs), 0)
    print(f"\n[{kind}] {name}: {trials} trials, {rounds} round(s)")
    print(
        f"{'mode':12s} {'efficiency':>10s} {'orch. s/trial':>13s} {'launches':>8s} "
        f"{'first step s: launch 1st':>24s} {'others':>7s}"
    )
    for mode, runs in results.items():
        eff = _median([x["measured"] / x["wall"] for x in runs], ".2f")
        per = _median(
            [(x["wall"] - x["measured"]) / x["trials"] for x in runs if x["trials"]], ".1f"
        )
        launches = _median([x["launches"] for x in runs], "g")
        first = _median([s for x in runs for s in x["first_step_first"]], ".2f")
        later = _median([s for x in runs for s in x["first_step_later"]], ".2f")
        print(f"{mode:12s} {eff:>10s} {per:>13s} {launches:>8s} {first:>24s} {later:>7s}")
    print(f"goals: efficiency >= {eff_goal:g}, orchestration <= {per_goal:g} s/trial")
    _print_ratio("tracking on / off", results.get("grouped", []), results.get("no-tracking", []))
    if "by-devices" in results:
        _print_ratio("grouped / by-devices", results["grouped"], results["by-devices"])


def pair_ratios(a_runs: list[dict], b_runs: list[dict]) -> tuple[list[float], list[float]]:
    """Throughput ratios a / b of the same trials measured in two modes in the same round:
    (one per round: the median over that round's trial pairs; every trial pair)."""
    per_round, per_trial = [], []
    by_round = {b["round"]: b for b in b_runs}
    for a in a_runs:
        b = by_round.get(a["round"], {"throughput": {}})
        ratios = [
            a["throughput"][t] / b["throughput"][t]
            for t in a["throughput"]
            if a["throughput"][t] and b["throughput"].get(t)
        ]
        if ratios:
            per_round.append(statistics.median(ratios))
            per_trial += ratios
    return per_round, per_trial


def _print_ratio(name: str, a_runs: list[dict], b_runs: list[dict]) -> None:
    """The per-round ratios' median and range, and the median over all trial pairs ("n/a"
    where no trial has a throughput in both modes)."""
    per_round, per_trial = pair_ratios(a_runs, b_runs)
    if not per_round:
        print(f"throughput {name}: n/a (no trial has a throughput in both modes)")
        return
    rounds = spread(per_round)
    print(
        f"throughput {name}: median {rounds.median:.3f} over {rounds.n} "
        f"rounds (range {rounds.lo:.3f}-{rounds.hi:.3f}; per round: "
        + " ".join(f"{r:.3f}" for r in per_round)
        + f"); over {len(per_trial)} trial pairs: median {statistics.median(per_trial):.3f}"
    )


if __name__ == "__main__":
    main()
