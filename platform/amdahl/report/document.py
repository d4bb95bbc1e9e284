"""The report as a neutral document (sections of paragraphs, tables and bullets) that the
terminal, Markdown and HTML renderers all format, so the three say the same thing.

Order: scaling mode, recommendation first, then the evidence behind it.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from amdahl.report.build import Report
from amdahl.report.compute import NO_SYNC, SETTINGS, Config, Stat, differs
from amdahl.report.diagnose import SEGMENTS, THRESHOLD_TEXT, cost_stat


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    title: str = ""


@dataclass
class Section:
    key: str
    title: str
    paras: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)


#: Columns holding text (left-aligned by the renderers); the rest hold numbers.
TEXT_COLUMNS = frozenset(
    {"configuration", "best by", "note", "reason", "status", "verdict", "bottleneck"}
)
#: Bullet lists longer than this are cut, pointing to the full table.
_MAX_LISTED = 10
SPREAD_NOTE = "spread = (max - min) / median over the repeats; n = repeats"


# --------------------------------------------------------------------------- formatting


def rate(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def spread(s: Stat | None) -> str:
    if s is None:
        return ""
    return "n=1" if s.n <= 1 else f"{s.rel_spread:.1%} (n={s.n})"


def times(x: float | None, s: Stat | None = None) -> str:
    if x is None:
        return "n/a"
    if s is not None and s.n > 1 and s.spread > 0:
        return f"{x:.2f}x ({s.lo:.2f}-{s.hi:.2f})"
    return f"{x:.2f}x"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1e3:.2f}"


def mib(x: float | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:,.1f}"


def scaling_statement(report: Report) -> str:
    modes = report.scaling_modes
    text = {
        "weak": "weak scaling (fixed per-device batch; the global batch grows with devices): "
        "speedup S(p) = throughput(p) / throughput(1)",
        "strong": "strong scaling (fixed global batch, split over devices): "
        "speedup S(p) = T(1) / T(p), T = seconds per optimizer step",
    }
    if not modes:
        return "scaling mode: unknown (no rows)"
    return "Scaling mode: " + "; ".join(text.get(m, m) for m in modes) + ". Ideal S = p; E = S/p."


# --------------------------------------------------------------------------- sections


def sections(report: Report) -> list[Section]:
    out = [_summary(report), _recommendation(report), _scaling(report), _breakdown(report)]
    out += [_communication(report), _efficiency(report), _quality(report)]
    if any(row.get("target") for c in report.configs for row in c.rows):
        out.append(_time_to_target(report))
    out.append(_failures(report))
    out.append(Section("thresholds", "Thresholds used", bullets=list(THRESHOLD_TEXT)))
    return out


def _summary(r: Report) -> Section:
    ok = sum(1 for c in r.configs if c.ok)
    sec = Section("summary", f"Sweep {r.name}")
    sec.paras.append(scaling_statement(r))
    sec.paras.append(
        f"{r.row_count} result rows, {len(r.configs)} configurations ({ok} with ok runs), "
        f"up to {r.max_repeats} repeat(s) each. {SPREAD_NOTE}."
    )
    sec.bullets = list(r.notes)
    return sec


def _recommendation(r: Report) -> Section:
    rec = r.recommendation
    sec = Section("recommendation", "Recommendation")
    if not rec.picks:
        sec.paras.append("No configuration can be recommended: no ok run qualifies.")
    else:
        sec.paras.append(rec.headline())
    rows = []
    for p in rec.picks:
        value = f"${p.value.median:,.3g}" if p.unit == "$" else f"{rate(p.value.median)} {p.unit}"
        tie = (
            "no measurable difference from: " + ", ".join(c.label for c in p.ties) if p.ties else ""
        )
        rows.append([p.goal, p.config.label, value, spread(p.value), tie])
    if rows:
        sec.tables.append(Table(["best by", "configuration", "value", "spread", "note"], rows))
    if r.price <= 0:
        sec.paras.append(
            "Cost: no report.cost_per_device_hour in spec.yaml, so no cost pick; the Pareto "
            "front uses device-hours per million samples."
        )
    if rec.pareto:
        front = [
            [c.label, rate(c.throughput.median), f"{cost_stat(c, r.price).median:.3g}"]
            for c in rec.pareto
        ]
        sec.tables.append(
            Table(
                ["configuration", "samples/s", rec.cost_label],
                front,
                title="Pareto front: nothing beats these on both throughput and cost",
            )
        )
    ceiling = [c for c, why in rec.excluded if c.sync == NO_SYNC and c.devices > 1]
    if ceiling:
        sec.bullets.append(
            f"not recommended: the {len(ceiling)} sync none configuration(s) with p > 1: "
            "they measure the no-communication ceiling (each worker trains its own model), "
            "they are not a way to train"
        )
    others = [(c, why) for c, why in rec.excluded if not (c.sync == NO_SYNC and c.devices > 1)]
    sec.bullets += [f"not recommended: {c.label}: {why}" for c, why in others[:_MAX_LISTED]]
    if len(others) > _MAX_LISTED:
        sec.bullets.append(
            f"... and {len(others) - _MAX_LISTED} more flagged configurations (Training quality)"
        )
    return sec


def _scaling(r: Report) -> Section:
    sec = Section("scaling", "Speedup against ideal")
    if not r.curves:
        sec.paras.append("No ok runs: nothing to scale.")
    for curve in r.curves:
        rows = []
        for pt in curve.points:
            x = pt.config.throughput
            rows.append(
                [
                    str(pt.devices),
                    rate(x.median),
                    spread(x),
                    times(pt.speedup.median if pt.speedup else None, pt.speedup),
                    f"{pt.devices}x",
                    times(pt.ceiling_speedup) if pt.ceiling else "",
                    pct(pt.efficiency),
                    pct(pt.comm_efficiency) if pt.ceiling else "",
                    f"{pt.karp_flatt:.3f}" if pt.karp_flatt is not None else "",
                ]
            )
        sec.tables.append(
            Table(
                [
                    "devices",
                    "samples/s",
                    "spread",
                    "speedup",
                    "linear ideal",
                    "no-comm ceiling",
                    "efficiency",
                    "of ceiling",
                    "Karp-Flatt e",
                ],
                rows,
                title=curve.label,
            )
        )
        sec.bullets += _curve_notes(curve)
    if r.curves:
        sec.paras.append(
            "No-comm ceiling: the same settings with sync none (each worker trains alone), so "
            "efficiency = (ceiling/p: hardware contention) x (of ceiling: communication). "
            "Karp-Flatt e = (1/S - 1/p)/(1 - 1/p); Amdahl fit S(p) = 1/(s + (1-s)/p) by least "
            "squares on S."
        )
    return sec


def _curve_notes(curve) -> list[str]:
    out = []
    head = curve.label
    if curve.baseline_note:
        out.append(f"{head}: {curve.baseline_note}")
    last = curve.points[-1]
    if last.ceiling_speedup and last.speedup and last.devices > 1:
        out.append(
            f"{head}: at p={last.devices}, {last.devices} workers alone reach "
            f"{last.ceiling_speedup:.2f}x ({last.contention_efficiency:.0%} of linear: hardware "
            f"contention); synchronisation keeps {last.comm_efficiency:.0%} of that"
        )
    fit = curve.fit
    if fit and fit.serial_fraction >= 1 - 1e-9:
        out.append(f"{head}: no Amdahl fit: {fit.quality}")
    elif fit:
        limit = "unbounded" if math.isinf(fit.limit) else f"{fit.limit:.2f}x"
        out.append(
            f"{head}: Amdahl serial fraction s = {fit.serial_fraction:.3f} (fit {fit.quality}); "
            f"no device count can pass 1/s = {limit}"
        )
        if curve.projections:
            proj = ", ".join(
                f"p={p.devices}: {p.speedup:.2f}x"
                + (f" (~{rate(p.throughput)} samples/s)" if p.throughput else "")
                for p in curve.projections
            )
            out.append(f"{head}: PROJECTION from the Amdahl fit, not measured: {proj}")
    return out


def _breakdown(r: Report) -> Section:
    sec = Section("breakdown", "Where the time went")
    sec.paras.append(
        "Milliseconds per optimizer step (medians over repeats): the step is the measured "
        "window / steps; exposed comm is taken out of the phase it hides in; other = time "
        "outside the timed phases (Python loop, slowest rank)."
    )
    rows = []
    for d in r.diagnoses:
        rows.append(
            [d.config.label, ms(d.wall_s), spread(d.config.step_wall)]
            + [ms(d.segments.get(s)) for s in SEGMENTS]
            + [d.bottleneck]
        )
    if rows:
        headers = ["configuration", "step", "step spread", *SEGMENTS, "bottleneck"]
        sec.tables.append(Table(headers, rows, title="ms per step"))
    for d in r.diagnoses:
        text = f"{d.config.label}: {d.bottleneck} ({d.evidence})"
        if d.also:
            text += "; also " + "; ".join(d.also)
        text += ". Try: " + "; ".join(d.advice)
        sec.bullets.append(text)
    sec.bullets += r.compile_notes
    return sec


def _communication(r: Report) -> Section:
    sec = Section("communication", "Communication: alpha-beta model against measurement")
    cal = r.calibration
    if cal is None or not cal.has_comm_model:
        sec.paras.append(
            "No calibration.json with alpha and bandwidth: run `platform calibrate DIR "
            "--devices N` to measure all-reduce latency and bandwidth for the ring prediction."
        )
    else:
        sec.paras.append(
            f"Ring all-reduce t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth with alpha = "
            f"{cal.alpha_s * 1e6:,.1f} us and bandwidth = {cal.bandwidth_Bps / 1e9:.3f} GB/s "
            f"(measured by `platform calibrate` on {cal.devices} devices, {cal.backend or '?'}"
            + (
                f", fit RMS relative error {cal.fit_rel_rmse:.0%}"
                if cal.fit_rel_rmse is not None
                else ""
            )
            + "; alpha and bandwidth are assumed the same at other p)."
        )
    rows = []
    for d in r.diagnoses:
        c = d.config
        if c.devices <= 1 or c.sync == NO_SYNC:
            continue
        measured = d.comm
        ratio = (
            f"{measured.median / d.predicted_comm_s:.2f}" if measured and d.predicted_comm_s else ""
        )
        if measured and d.predicted_comm_s:
            sec.bullets.append(f"{c.label}: {_comm_verdict(measured.median / d.predicted_comm_s)}")
        rows.append(
            [
                c.label,
                mib(d.grad_bytes) if d.grad_bytes else "unknown",
                ms(d.predicted_comm_s) if d.predicted_comm_s is not None else "",
                ms(measured.median) if measured else "",
                ("" if measured is None else "no measurable" if not d.comm_measurable else "")
                + (f" {spread(measured)}" if measured else ""),
                ratio,
            ]
        )
    if rows:
        sec.tables.append(
            Table(
                [
                    "configuration",
                    "gradient MiB",
                    "predicted ms",
                    "measured exposed ms",
                    "spread",
                    "measured/predicted",
                ],
                rows,
            )
        )
        sec.paras.append(
            "Measured exposed communication = phase time with the sync strategy minus the same "
            "configuration with sync none; below the prediction means overlap with backward, "
            "above it means contention or framework cost the model leaves out."
        )
        if not any(d.grad_bytes for d in r.diagnoses):
            sec.paras.append(
                "Gradient bytes unknown (not in calibration.json): no prediction. "
                "`platform calibrate` records them when the sweep directory has spec.yaml."
            )
    else:
        sec.paras.append("No multi-device configuration with synchronisation in this sweep.")
    return sec


def _comm_verdict(ratio: float) -> str:
    if ratio < 0.5:
        return (
            f"exposed communication is {ratio:.2f}x the ring prediction: most of the all-reduce "
            "hides under backward (overlap works)"
        )
    if ratio <= 2:
        return f"exposed communication is {ratio:.2f}x the ring prediction: the model explains it"
    return (
        f"exposed communication is {ratio:.2f}x the ring prediction: the wire time is not the "
        "whole cost (DDP bucketing and hooks, workers contending for shared cores or links)"
    )


def _efficiency(r: Report) -> Section:
    sec = Section("efficiency", "Hardware efficiency and memory")
    cal = r.calibration
    if cal and cal.peak_flops:
        peaks = ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in cal.peak_flops.items())
        sec.paras.append(
            f"MFU = achieved FLOP/s / (p x peak); peak per device: {peaks} "
            f"({cal.peak_source or 'source not stated'})."
        )
    else:
        sec.paras.append("No peak FLOP/s in calibration.json: MFU not computed.")
    rows = []
    for d in r.diagnoses:
        c = d.config
        flops = c.stat("achieved_flops")
        mem = c.stat("peak_mem_bytes")
        comp = c.stat("compile_s")
        rows.append(
            [
                c.label,
                f"{flops.median / 1e9:,.2f}" if flops else "n/a",
                f"{d.mfu:.1%} ({d.mfu_peak})" if d.mfu is not None else "n/a",
                mib(mem.median) if mem else "n/a",
                spread(mem),
                f"{comp.median:.2f}" if comp else "n/a",
            ]
        )
    if rows:
        sec.tables.append(
            Table(
                [
                    "configuration",
                    "achieved GFLOP/s",
                    "MFU",
                    "peak memory / device MiB",
                    "memory spread",
                    "compile s",
                ],
                rows,
            )
        )
    if any(d.mfu is not None and d.mfu > 1 for d in r.diagnoses):
        sec.bullets.append(
            "MFU above 100%: the workload beats the measured peak, so the peak (a square matmul "
            "on one worker) understates the device or the workload's FLOPs per sample overstate "
            "its work; read MFU as relative between configurations"
        )
    sec.bullets += [f"batch limit: {b.text}" for b in r.batch_limits]
    return sec


def _quality(r: Report) -> Section:
    sec = Section("quality", "Training quality")
    rows = []
    for q in r.quality.values():
        if q.reference is None or q.reference is q.config:
            continue
        rows.append([q.config.label, "FLAGGED" if q.worse else "ok", q.text])
    if rows:
        sec.tables.append(
            Table(["configuration", "verdict", "against its fp32 eager reference"], rows)
        )
    else:
        sec.paras.append(
            "No configuration has an fp32/eager/ddp twin of the same shape to compare against."
        )
    return sec


def _time_to_target(r: Report) -> Section:
    """Time-to-target mode: hardware speed x statistical efficiency, what a larger batch or a
    lower precision trades (faster steps against more of them)."""
    sec = Section("time_to_target", "Time to target")
    goals = sorted({row["target"] for c in r.configs for row in c.rows if row.get("target")})
    sec.paras.append(
        f"Target {', '.join(goals)}, checked on the validation split every eval_every steps "
        "after warmup. Time to target runs from the first step (warmup and compilation "
        "included) to the end of the step whose validation met it, validation time excluded."
    )
    rows = []
    for c in sorted(r.configs, key=lambda c: _ttt_key(c.stat("time_to_target_s"))):
        if not c.ok:
            continue
        ttt, steps = c.stat("time_to_target_s"), c.stat("steps_to_target")
        batch = c.stat("global_batch")
        reached = f"{ttt.n}/{len(c.ok_rows)}" if ttt else f"0/{len(c.ok_rows)}"
        rows.append(
            [
                c.label,
                f"{ttt.median:.2f}" if ttt else "missed",
                spread(ttt),
                f"{steps.median:,.0f}" if steps else "n/a",
                f"{steps.median * batch.median:,.0f}" if steps and batch else "n/a",
                rate(c.throughput.median if c.throughput else None),
                reached,
            ]
        )
    sec.tables.append(
        Table(
            [
                "configuration",
                "time to target s",
                "spread",
                "steps",
                "samples",
                "samples/s",
                "reached",
            ],
            rows,
        )
    )
    return sec


def _ttt_key(s: Stat | None) -> float:
    return s.median if s else math.inf


def _failures(r: Report) -> Section:
    sec = Section("failures", "Failed, out-of-memory, diverged and refused trials")
    rows = [[f.label, f.status, str(f.count), f.reason] for f in r.failures]
    if rows:
        sec.tables.append(Table(["configuration", "status", "runs", "reason"], rows))
    else:
        sec.paras.append("Every trial ran ok.")
    return sec


# --------------------------------------------------------------------------- side by side


def comparison(reports: list[Report]) -> Section:
    """Configurations present in the first sweep and another, throughput side by side."""
    first = reports[0]
    sec = Section("comparison", "Side by side: " + " vs ".join(r.name for r in reports))

    def key(c: Config) -> tuple:
        return tuple(c.settings[k] for k in (*SETTINGS, "devices"))

    others = [{key(c): c for c in r.configs if c.ok} for r in reports[1:]]
    rows = []
    for c in first.configs:
        if not c.ok:
            continue
        row = [c.label, f"{rate(c.throughput.median)} {spread(c.throughput)}"]
        matched = False
        for other in others:
            o = other.get(key(c))
            if o is None:
                row += ["", ""]
                continue
            matched = True
            verdict = (
                f"{o.throughput.median / c.throughput.median:.2f}x"
                if differs(o.throughput, c.throughput)
                else "no measurable difference"
            )
            row += [f"{rate(o.throughput.median)} {spread(o.throughput)}", verdict]
        if matched:
            rows.append(row)
    headers = ["configuration", f"{first.name} samples/s"]
    for r in reports[1:]:
        headers += [f"{r.name} samples/s", "vs first"]
    if rows:
        sec.tables.append(Table(headers, rows))
    else:
        sec.paras.append("The sweeps share no configuration.")
    return sec
