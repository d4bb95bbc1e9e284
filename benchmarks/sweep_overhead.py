"""Where a sweep's wall time goes: measured steps vs orchestration, grouped vs raw launches.

Runs sweeps/laptop.yaml (or the file given) in one process on one local Ray, interleaving:
  grouped      the platform: trials sharing a worker-group shape run in one TorchTrainer; on
               one node, one worker group serves every device count (worlds.py)
  by-devices   one worker group per device count (the grouping before worlds.py)
  raw          the raw Tune+Train pattern: a Tune function trainable fits one TorchTrainer
               per trial (same harness, same trials)
  no-tracking  grouped, with the MLflow mirror off
and prints, per mode, sweep efficiency = seconds inside measured steps / sweep wall seconds and
orchestration seconds per trial = (wall - measured) / trials, plus throughput ratios over the
same trials: tracking on / off, and grouped / by-devices (a trial on fewer devices than its
worker group must measure what a group of its own would: the ratio should be 1 within noise).
Goals (docs/architecture.md): efficiency >= 0.6, <= 3 s per trial, tracking on/off >= 0.98.
Ratios are measured side by side in one run; nothing is asserted.

    python benchmarks/sweep_overhead.py [SPEC] [--rounds N] [--skip-raw]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "sweeps" / "laptop.yaml"))
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per mode")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument(
        "--skip-raw",
        action="store_true",
        help="leave out raw (more rounds of the other modes in the same time)",
    )
    args = parser.parse_args()

    import ray

    from amdahl import load_spec, run_sweep

    work = Path(tempfile.mkdtemp(prefix="amdahl-bench-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    spec = load_spec(args.spec, args.overrides)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    modes = {
        "grouped": {"group_launches": True, "tracking": True},
        "by-devices": {"share_across_devices": False, "tracking": True},
        "raw": {"group_launches": False, "tracking": True},
        "no-tracking": {"group_launches": True, "tracking": False},
    }
    if args.skip_raw:
        del modes["raw"]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    # One untimed sweep first: the training set gets generated and cached, imports warm up.
    run_sweep(spec, runs_dir=work / "warmup", tracking=False, on_event=None)
    for r in range(args.rounds):
        for mode, kwargs in modes.items():
            start = time.perf_counter()
            outcome = run_sweep(spec, runs_dir=work / mode, **kwargs)
            wall = time.perf_counter() - start
            rows = outcome.rows
            measured = sum(row.get("measured_s") or 0.0 for row in rows)
            results[mode].append(
                {
                    "wall": wall,
                    "measured": measured,
                    "trials": len(rows),
                    "throughput": {row["trial_id"]: row.get("throughput") for row in rows},
                }
            )
            print(
                f"round {r} {mode:12s} wall {wall:6.1f} s, measured {measured:6.1f} s, "
                f"{len(rows)} trials",
                flush=True,
            )
    ray.shutdown()

    print(f"\n{spec.name}: {results['grouped'][0]['trials']} trials, {args.rounds} round(s)")
    print(f"{'mode':12s} {'efficiency':>10s} {'orchestration s/trial':>22s}")
    for mode, runs in results.items():
        eff = statistics.median(x["measured"] / x["wall"] for x in runs)
        per = statistics.median((x["wall"] - x["measured"]) / x["trials"] for x in runs)
        print(f"{mode:12s} {eff:10.2f} {per:22.1f}")
    _print_ratio("tracking on / off", results["grouped"], results["no-tracking"])
    if "by-devices" in results:
        _print_ratio("grouped / by-devices", results["grouped"], results["by-devices"])


def _print_ratio(name: str, a_runs: list[dict], b_runs: list[dict]) -> None:
    """Median throughput ratio of the same trials measured in two modes, round by round."""
    ratios = []
    for a, b in zip(a_runs, b_runs, strict=True):
        ratios += [
            a["throughput"][t] / b["throughput"][t]
            for t in a["throughput"]
            if a["throughput"][t] and b["throughput"].get(t)
        ]
    print(
        f"throughput {name}: median {statistics.median(ratios):.3f} "
        f"over {len(ratios)} trial pairs (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
