"""Where one sweep's wall time goes, as an event timeline: Ray start and planning, each launch's
start (worker group, input, peak probe), each trial (its own wall seconds split into setup,
warmup, measured window and the rest), the gaps between trials, and the end (report, MLflow).

    python benchmarks/sweep_timeline.py [SPEC] [--set key=value ...] [--no-tracking]

Driver-side events are stamped when the driver sees them (the progress callback); worker-side
seconds come from the rows. Nothing is asserted; run it before and after a change, on a quiet
machine, and compare the lines.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "sweeps" / "laptop.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-tracking", action="store_true")
    args = parser.parse_args()

    from amdahl import load_spec, run_sweep

    work = Path(tempfile.mkdtemp(prefix="amdahl-timeline-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    spec = load_spec(args.spec, args.overrides)
    events: list[tuple[float, str, str]] = []
    start = time.perf_counter()

    def on_event(kind: str, payload: dict) -> None:
        what = ""
        if kind == "launch_started":
            launch = payload["launch"]
            what = f"{launch.launch_id} ({len(launch.trials)} trials, d{launch.device_counts})"
        elif kind == "trial_done":
            row = payload["row"]
            what = f"{row['trial_id']} r{row['repeat']} {row['status']}"
        events.append((time.perf_counter() - start, kind, f"{what} @{time.time():.2f}"))

    outcome = run_sweep(
        spec, runs_dir=work / "runs", tracking=not args.no_tracking, on_event=on_event
    )
    wall = time.perf_counter() - start
    rows = {(r["trial_id"], r["repeat"]): r for r in outcome.rows}

    print(f"{'t (s)':>7s}  {'event':16s} detail")
    last = 0.0
    for t, kind, what in events:
        line = f"{t:7.2f}  {kind:16s} {what}  (+{t - last:.2f})"
        if kind == "trial_done":
            tid, rep = what.split()[0], int(what.split()[1][1:])
            r = rows.get((tid, rep), {})
            parts = ("setup_s", "warmup_s", "measured_s", "wall_s")
            line += "  " + " ".join(f"{p[:-2]} {r.get(p) or 0:.2f}" for p in parts)
        print(line)
        last = t
    trial_wall = sum(r.get("wall_s") or 0.0 for r in outcome.rows)
    measured = sum(r.get("measured_s") or 0.0 for r in outcome.rows)
    first = next((t for t, k, _ in events if k == "launch_started"), wall)
    print(
        f"\nwall {wall:.1f} s: before the first launch {first:.1f} s; inside trials "
        f"{trial_wall:.1f} s (measured windows {measured:.1f} s); elsewhere "
        f"{wall - first - trial_wall:.1f} s; {len(outcome.rows)} trials"
    )


if __name__ == "__main__":
    main()
