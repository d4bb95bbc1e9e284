"""What the CLI shows while it works: the plan table, the live sweep progress, the closing summary.

(The report's renderers are report/render_text.py and report/render_html.py.)
"""

from __future__ import annotations

import time
from typing import Any

from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from amdahl.analysis.memory_model import UNBOUNDED_BATCH
from amdahl.cli.terminal import Terminal
from amdahl.driver.events import (
    Calibrating,
    LaunchStarted,
    Planned,
    RayConnected,
    RungStarted,
    SweepEvent,
    TrackingOpened,
    TrialDone,
)
from amdahl.plan.launches import SweepPlan
from amdahl.sweepdir.layout import SweepDir

console = Terminal()


def print_plan(plan: SweepPlan) -> None:
    table = Table(
        title=f"{escape(plan.spec.name)}: {len(plan.runnable)} of {len(plan.trials)} trials "
        f"will run in {len(plan.launches())} launches"
    )
    for col in ("trial", "settings", "resources", "peak memory / device", "status"):
        table.add_column(col, justify="right" if col.startswith("peak") else "left")
    for t in plan.trials:
        status = "[green]will run[/]" if t.refused is None else "[red]refused[/]"
        memory = t.predicted_peak_mem_bytes
        table.add_row(
            Text(t.trial_id),
            Text(plan.labels[t.trial_id]),
            Text(t.resources.describe()),
            Text(f"{memory / 2**20:,.0f} MiB" if memory is not None else "n/a"),
            status,
        )
    console.print(table)
    _print_largest_batches(plan)
    nodes = ", ".join(f"{n.name} {n.cpus:g} CPU {n.gpus:g} GPU" for n in plan.nodes)
    console.print(f"cluster: {nodes}", soft_wrap=True, markup=False)
    if plan.resource_note:
        console.print(plan.resource_note, soft_wrap=True, markup=False, highlight=False)
    if plan.refused:
        console.print("will not run:")
        for t in plan.refused:  # one unwrapped line each, so the reason stays greppable
            console.print(
                f"  {t.trial_id} {plan.labels[t.trial_id]}: {t.refused}",
                soft_wrap=True,
                markup=False,
                highlight=False,
            )


def _print_largest_batches(plan: SweepPlan) -> None:
    """The largest per-device batch predicted to fit, per configuration family and device
    count (only where `resources.device_memory_gb` is given)."""
    fits: dict[str, int] = {}
    for t in plan.trials:
        if t.largest_batch_fits is not None:
            words = plan.labels[t.trial_id].split()  # the label less its batch: the family
            family = " ".join(w for w in words if not (w[0] == "b" and w[1:].isdigit()))
            fits[family] = t.largest_batch_fits
    if not fits:
        return
    console.print("largest per-device batch predicted to fit the device's memory:")
    for family, batch in fits.items():
        text = f"{batch:,}" if batch < UNBOUNDED_BATCH else "any"
        console.print(f"  {family}: {text if batch else 'none'}", markup=False, highlight=False)


class LiveProgress:
    """A live table of trials (status, throughput) with elapsed time and an ETA.

    Drawn from the `Planned` event on, not on entering: whatever fails before there is a
    plan (the workload's import and checks, Ray's start, planning) prints its error alone.
    """

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.started = time.perf_counter()
        self.activity = ""  # what runs that is not a trial (search.calibration: auto)
        self.rung = ""  # search: halving: the rung being measured
        self.sweep_dir = ""
        self.live = Live(self._table(), console=console, refresh_per_second=2, transient=False)

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live.is_started:
            self.live.__exit__(*exc)

    def event(self, event: SweepEvent) -> None:
        """`run_sweep`'s `on_event`: one sweep event (driver.events), dispatched on its type."""
        if isinstance(event, TrackingOpened):
            print_link(event.link)  # from the tracker's thread: print only, the table is not ours
            return
        self.activity = _activity(event)
        match event:
            case RayConnected(line=line):
                console.print(line, soft_wrap=True, markup=False, highlight=False)
            case Planned():
                self._planned(event)
            case LaunchStarted(launch=launch):
                for t in launch.trials:
                    for key, row in self.rows.items():
                        if key.startswith(t.trial_id) and row["status"] == "pending":
                            row["status"] = "running"
            case TrialDone(row=row):
                self._trial_done(row)
            case RungStarted():
                self.rung = (
                    f"; search rung {event.rung} of {event.rungs}: "
                    f"{len(event.configurations)} configurations for {event.steps} steps"
                )
        self.live.update(self._table())

    def _planned(self, event: Planned) -> None:
        plan = event.plan
        if plan.resource_note:
            console.print(plan.resource_note, soft_wrap=True, markup=False, highlight=False)
        self.live.start()
        self.sweep_dir = str(event.sweep_dir)
        for t in plan.trials:
            for r in range(plan.spec.train.repeats):
                key = f"{t.trial_id}:{r}"
                self.order.append(key)
                self.rows[key] = {
                    "label": plan.labels[t.trial_id] + (f" r{r}" if r else ""),
                    "status": "refused"
                    if t.refused
                    else "earlier"
                    if (t.trial_id, r) in event.finished
                    else "pending",
                    "throughput": "",
                    "note": t.refused or "",
                }

    def _trial_done(self, row: dict[str, Any]) -> None:
        key = f"{row['trial_id']}:{row['repeat']}"
        first = f"{row['trial_id']}:0"
        if key not in self.rows and first in self.rows:
            # a repeat only the search's last rung runs (search.final_repeats)
            self.order.insert(self.order.index(first) + row["repeat"], key)
            self.rows[key] = {"label": f"{self.rows[first]['label']} r{row['repeat']}"}
        entry = self.rows.get(key)
        if entry is None:
            return
        entry["status"] = row["status"]
        entry["throughput"] = f"{row['throughput']:,.0f}" if row.get("throughput") else ""
        # the reason's first line whole (the table wraps it): it ends with where in the user's
        # code the trial failed (worker/failure_site.py)
        entry["note"] = (row.get("error") or "").splitlines()[0] if row.get("error") else ""
        if row.get("rung") is not None:  # search: halving shows the latest rung
            rung = f"rung {row['rung']} ({row['steps']} steps)"
            entry["note"] = f"{rung}: {entry['note']}" if entry["note"] else rung

    def _table(self) -> Table:
        done = [
            r
            for r in self.rows.values()
            if r["status"] not in ("pending", "running", "refused", "earlier")
        ]
        todo = [r for r in self.rows.values() if r["status"] in ("pending", "running")]
        elapsed = time.perf_counter() - self.started
        eta = f", ETA {elapsed / len(done) * len(todo):.0f} s" if done and todo else ""
        # A search's rungs hold configurations already measured in the rung before, and which
        # go on is decided as it runs: the title gives the rung instead of counts and an ETA.
        where = (
            f"{elapsed:.0f} s{self.rung}"
            if self.rung
            else f"{len(done)} done, {len(todo)} to go, {elapsed:.0f} s{eta}"
        )
        # Labels, notes (error text) and the directory are data, not markup: an error such as
        # "[/data]" would make rich raise, and "[batch, 784]" would vanish as an unknown tag.
        table = Table(title=Text(f"{self.sweep_dir} - {where}{self.activity}"))
        for col in ("trial", "status", "samples/s", "note"):
            table.add_column(col)
        colours = {"ok": "green", "running": "yellow", "pending": "dim"}
        for key in self.order:
            r = self.rows[key]
            c = colours.get(r["status"], "red")
            table.add_row(
                Text(r["label"]), Text(r["status"], style=c), Text(r["throughput"]), Text(r["note"])
            )
        return table


def print_outcome(outcome: Any) -> None:
    """The closing summary, one unwrapped line per item (`soft_wrap`): piped into a log, rich
    assumes 80 columns and would break sentences and paths where a reader greps or copies."""
    rows = outcome.rows
    ok = [r for r in rows if r["status"] == "ok"]
    # each item's own window: a continued row's measured_s pools its earlier rungs' windows
    measured = sum(r.get("item_measured_s") or r.get("measured_s") or 0.0 for r in ok)
    console.print(
        f"\n{len(ok)} of {len(rows)} trial runs ok in {outcome.wall_s:.1f} s "
        f"({measured:.1f} s inside measured steps, "
        f"{(outcome.wall_s - measured) / max(len(rows), 1):.1f} s per trial outside them).",
        soft_wrap=True,
    )
    if starts := outcome.group_starts:
        first = outcome.first_measured_s
        console.print(
            f"{starts} worker group{'s' if starts > 1 else ''} started"
            + (f" ({_why_started(outcome.group_start_reasons)})" if starts > 1 else "")
            + (f"; first measured step {first:.1f} s after the start" if first else "")
            + ".",
            soft_wrap=True,
        )
    if source := getattr(outcome, "calibration_reused_from", None):
        console.print(
            f"calibration: reused from {source} (same cluster shape, within a day); "
            "--recalibrate measures it again",
            markup=False,
            soft_wrap=True,
        )
    elif getattr(outcome, "calibration_s", 0.0):
        console.print(
            f"calibration: measured in {outcome.calibration_s:.1f} s; later sweeps on this "
            "cluster shape in this runs directory reuse it for a day",
            markup=False,
            soft_wrap=True,
        )
    files = SweepDir(outcome.sweep_dir)
    console.print(f"results: {files.results}", markup=False, soft_wrap=True)
    if files.report_html.exists():
        console.print(
            f"report:  {files.report_html} (and {files.report_md.name}); "
            f"terminal view: platform report {outcome.sweep_dir}",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print(f"report:  platform report {outcome.sweep_dir}", markup=False, soft_wrap=True)
    if files.best.exists():  # written with the report where it recommends a configuration
        from amdahl.report.best import sweep_command

        console.print(f"best:    {sweep_command(files.best)}", markup=False, soft_wrap=True)
    if getattr(outcome, "tracking", None) is not None:
        print_link(outcome.tracking)
    for line in search_summary(outcome):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if outcome.failed:
        console.print(
            f"[red]{len(outcome.failed)} trial runs did not succeed[/]; reasons are in "
            f"the results table and `platform report`.",
            soft_wrap=True,
        )


def print_link(link: Any) -> None:
    """The MLflow link that opens the sweep's runs table (`track.ui_link.TrackingLink`), one
    unwrapped line each, so it stays clickable and copyable."""
    for line in link.lines():
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def _why_started(reasons: list[str]) -> str:
    """Why the worker groups started, counted: "3 x first start of a shape; 1 x again for the
    calibration: ..." (a shape started twice costs a group start: this says what caused it)."""
    counts: dict[str, int] = {}
    for why in reasons:
        counts[why] = counts.get(why, 0) + 1
    return "; ".join(f"{n} x {why}" for why, n in counts.items())


def search_summary(outcome: Any) -> list[str]:
    """search: halving: the configuration it found, and the finalists it cannot tell apart
    from it (search.halving.indistinct), or where the search stopped."""
    from amdahl.search.objectives import describe

    state = outcome.search
    if state is None or not state.rungs:
        return []
    labels = outcome.plan.labels
    search = outcome.plan.spec.search
    last = state.rungs[-1]
    if last.index != len(state.steps) - 1 or not last.measured:
        return [f"search: stopped after rung {last.index}; nothing reached the last rung"]
    best = last.measured[0]
    runs = last.repeats[best]
    lo, hi = runs[0], runs[-1]
    if search.objective == "time_to_target":
        spread = f": {describe(hi, search.objective)} to {describe(lo, search.objective)}"
    else:
        spread = f": {lo:,.0f} to {hi:,.0f}"
    lines = [
        f"search: best {labels.get(best, best)}: {describe(last.values[best], search.objective)}"
        + (f" (median of {len(runs)} runs{spread})" if len(runs) > 1 else "")
    ]
    if last.tied:
        why = "their ranges overlap" if len(runs) > 1 else "within one run's per-step noise"
        names = ", ".join(labels.get(t, t) for t in last.tied)
        lines.append(f"  not measurably different from it ({why}): {names}")
    if len(runs) == 1 and len(last.measured) > 1:
        second = last.measured[1]
        lines.append(
            f"  one run per finalist, so the noise between runs is not measured (the runner-up, "
            f"{labels.get(second, second)}, is {1 - last.values[second] / last.values[best]:.1%} "
            "below); search.final_repeats: 3 measures it"
        )
    cut = [r for r in state.rungs[:-1] if r.cutoff is not None and len(r.kept) < len(r.measured)]
    if cut and all(r.run_sd is None for r in cut):
        lines.append(
            "  the rungs' cuts saw one run per configuration, so only its per-step noise, not "
            "the noise between runs: train.repeats: 2 measures it (and doubles each rung)"
        )
    elif cut:
        sds = ", ".join(f"{r.run_sd:.1%}" for r in cut if r.run_sd is not None)
        lines.append(f"  the rungs' cuts: beyond two standard errors of the runs' spread ({sds})")
    return lines + _continuation_summary(outcome.rows)


def _continuation_summary(rows: list[dict[str, Any]]) -> list[str]:
    """How many promoted runs went on from the rung before (search.continue_rungs) and, for
    those that started again, the first reason."""
    promoted = [r for r in rows if (r.get("rung") or 0) > 0 and r.get("status") == "ok"]
    continued = sum(1 for r in promoted if r.get("continued_from"))
    again = [r["restart_reason"] for r in promoted if r.get("restart_reason")]
    if not continued and not again:
        return []
    line = f"  rungs continued: {continued} of {continued + len(again)} promoted runs went on "
    line += "from the rung before (set-up and warmup paid once)"
    if again:
        line += f"; {len(again)} started again (first: {again[0]})"
    return [line]


def _activity(event: SweepEvent) -> str:
    """The title's note on what runs that is not a trial (search.calibration: auto)."""
    if isinstance(event, Calibrating):
        return f"; measuring the all-reduce on {event.devices} workers for the step-time model"
    return ""
