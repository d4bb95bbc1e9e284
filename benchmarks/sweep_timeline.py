"""Where one sweep's wall time goes, as an event timeline: Ray start and planning, each launch's
start (worker group, input, peak probe), each trial (its own wall seconds split into setup,
warmup, measured window and the rest), the gaps between trials, and the end (report, MLflow);
then how many worker groups were started and when the first measured step began.

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

from _harness import add_smoke_flag, print_stamp

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "sweeps" / "laptop.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-tracking", action="store_true")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:
        args.overrides = [*args.overrides, "train.steps=5", "grid.batch_size=[64]"]
    print_stamp()

    from amdahl import load_spec, run_sweep
    from amdahl.driver.events import LaunchStarted, SweepEvent, TrialDone

    work = Path(tempfile.mkdtemp(prefix="amdahl-timeline-"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    spec = load_spec(args.spec, args.overrides)
    events: list[tuple[float, float, str, str]] = []  # (since start, unix time, kind, detail)
    start = time.perf_counter()

    def on_event(event: SweepEvent) -> None:
        what = ""
        if isinstance(event, LaunchStarted):
            what = event.launch.launch_id
        elif isinstance(event, TrialDone):
            what = f"{event.row['trial_id']} r{event.row['repeat']}"
        events.append((time.perf_counter() - start, time.time(), type(event).__name__, what))

    outcome = run_sweep(
        spec, runs_dir=work / "runs", tracking=not args.no_tracking, on_event=on_event
    )
    wall = time.perf_counter() - start
    rows = {f"{r['trial_id']} r{r['repeat']}": r for r in outcome.rows}
    first_rows = {r["launch_id"]: r for r in outcome.rows if r.get("launch_setup_s") is not None}

    print(f"{'t (s)':>7s}  {'event':16s} detail")
    last = 0.0
    starts = {"ray start": 0.0, "worker setup": 0.0}
    for t, unix, kind, what in events:
        line = f"{t:7.2f}  {kind:16s} {what}  (+{t - last:.2f})"
        if kind == "LaunchStarted" and what in first_rows:
            first = first_rows[what]
            ray_s = first["launch_entered_unix_s"] - unix
            starts["ray start"] += ray_s
            starts["worker setup"] += first["launch_setup_s"]
            setup = first["launch_setup_s"]
            line += f"  Ray Train start {ray_s:.2f} s, worker set-up {setup:.2f} s"
        if kind == "TrialDone":
            r = rows.get(what, {})
            parts = ("setup_s", "warmup_s", "first_step_s", "measured_s", "wall_s")
            line += "  " + " ".join(f"{p[:-2]} {r.get(p) or 0:.2f}" for p in parts)
            line += f"  outside the window {_outside(r)['outside']:.2f}"
        print(line)
        last = t
    _print_fixed_cost([r for r in outcome.rows if r.get("status") == "ok"])
    _print_rung_gaps(outcome.rows)
    trial_wall = sum(r.get("wall_s") or 0.0 for r in outcome.rows)
    measured = sum(r.get("item_measured_s") or r.get("measured_s") or 0.0 for r in outcome.rows)
    first = next((t for t, _, k, _ in events if k == "LaunchStarted"), wall)
    between = wall - first - trial_wall - starts["ray start"] - starts["worker setup"]
    print(
        f"\nwall {wall:.1f} s over {len(outcome.rows)} trials:\n"
        f"  before the first launch (Ray, plan, data) {first:6.1f} s\n"
        f"  Ray Train starting worker groups           {starts['ray start']:6.1f} s\n"
        f"  workers' set-up before their first trial  {starts['worker setup']:6.1f} s\n"
        f"  inside trials                             {trial_wall:6.1f} s "
        f"(measured windows {measured:.1f} s)\n"
        f"  the rest (reports, launch ends, report)   {between:6.1f} s\n"
        f"worker groups started: {outcome.group_starts}; first measured step "
        + (f"{outcome.first_measured_s:.1f} s" if outcome.first_measured_s else "n/a")
        + " after run_sweep was called"
    )


#: An item's seconds outside its measured window, by part (results columns, worker-side).
OUTSIDE_PARTS = (
    "handover_s",
    "setup_s",
    "warmup_s",
    "comm_probe_s",
    "validation_s",
    "profile_s",
    "flops_count_s",
)


def _outside(r: dict) -> dict[str, float]:
    """The item's time outside its window by part; `other`: the rest of its wall seconds (the
    row's gather and the statistics), `outside`: all of it (the hand-over included)."""
    parts = {p: r.get(p) or 0.0 for p in OUTSIDE_PARTS}
    if r.get("continued_from"):  # a continued rung's set-up and warmup columns are its first's
        parts["setup_s"] = parts["warmup_s"] = 0.0
    wall = (r.get("wall_s") or 0.0) - (r.get("item_measured_s") or r.get("measured_s") or 0.0)
    parts["other"] = max(0.0, wall - sum(v for p, v in parts.items() if p != "handover_s"))
    parts["outside"] = wall + parts["handover_s"]
    return parts


def _print_fixed_cost(rows: list[dict]) -> None:
    """Median per item of each part outside the window (goal: <= 0.1 s in all at 1 device)."""
    import statistics

    if not rows:
        return
    split = [_outside(r) for r in rows]
    keys = [*OUTSIDE_PARTS, "other", "outside"]
    cells = "  ".join(
        f"{k.removesuffix('_s')} {statistics.median(s[k] for s in split):.3f}" for k in keys
    )
    print(f"\nper item outside its window, median over {len(rows)} ok items (s): {cells}")


def _print_rung_gaps(rows: list[dict]) -> None:
    """A search's hand-over between rungs: from the end of a rung's last row to the start of
    the next rung's first (the driver's decision and the queue's hand-over; a calibration
    measured between them is left out: its seconds are the outcome's)."""
    from datetime import datetime

    spans: dict[int, list[float]] = {}
    for r in rows:
        if r.get("rung") is None or not r.get("started_at"):
            continue
        start = datetime.fromisoformat(r["started_at"]).timestamp()
        first, last = spans.setdefault(r["rung"], [start, start])
        spans[r["rung"]] = [min(first, start), max(last, start + (r.get("wall_s") or 0.0))]
    rungs = sorted(spans)
    gaps = [spans[b][0] - spans[a][1] for a, b in zip(rungs, rungs[1:], strict=False)]
    if gaps:
        print("between rungs (s): " + " ".join(f"{g:.3f}" for g in gaps))


if __name__ == "__main__":
    main()
