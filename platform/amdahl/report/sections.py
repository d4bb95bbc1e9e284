"""The report's sections, in the order people read them: the sweep and its scaling mode, the
recommendation first, then the evidence behind it (speedup against ideal, where the time went,
the model sections of model_sections.py, hardware efficiency, quality, time to target, the
halving search, failures) and the thresholds used.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from amdahl.analysis.configs import NO_SYNC, Config
from amdahl.analysis.scaling import Curve
from amdahl.analysis.stats import Stat
from amdahl.report.bottleneck import THRESHOLD_TEXT
from amdahl.report.build import Report
from amdahl.report.diagnose import SEGMENTS, flops_notes
from amdahl.report.document import Section, Table, mib, ms, pct, rate, spread, times
from amdahl.report.memory_section import memory_section
from amdahl.report.model_sections import communication_section, predicted_section
from amdahl.report.overview import overview_section
from amdahl.report.recommend import cost_stat

if TYPE_CHECKING:
    from amdahl.search.halving import SearchState

#: Bullet lists longer than this are cut, pointing to the full table.
_MAX_LISTED = 10
SPREAD_NOTE = "spread = (max - min) / median over the repeats; n = repeats"


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
    if report.configs and not any(c.ok for c in report.configs):
        # nothing to rank or model: what failed, and where, is the whole report
        return [_summary(report), failures_section(report)]
    out = [_summary(report), overview_section(report), _recommendation(report)]
    out += [_scaling(report), _breakdown(report)]
    out += [communication_section(report), predicted_section(report)]
    out += [_efficiency(report), memory_section(report), _quality(report)]
    if any(row.get("target") for c in report.configs for row in c.rows):
        out.append(_time_to_target(report))
    if report.search is not None:
        out.append(search_section(report))
    out.append(failures_section(report))
    out.append(Section("thresholds", "Thresholds used", bullets=list(THRESHOLD_TEXT)))
    return out


def search_section(r: Report) -> Section:
    """search: halving: each rung (what it measured, kept and dropped, and why), what the
    step-time model skipped, and the final ranking."""
    state = r.search
    assert state is not None
    # The report's own labels (every varying axis named alike) where the trial was measured;
    # plan.json's for a trial the model skipped.
    measured = {row.get("trial_id"): c.label for c in r.configs for row in c.rows}
    label = lambda tid: measured.get(tid) or r.labels.get(tid, tid)  # noqa: E731
    sec = Section("search", "Search: successive halving")
    rungs = len(state.steps)
    sec.paras.append(
        f"{rungs} rung(s) of {', '.join(str(s) for s in state.steps)} measured steps; "
        + ("finished." if state.finished else f"stopped after rung {len(state.rungs) - 1}.")
    )
    sec.tables.append(
        Table(
            ["rung", "steps", "measured", "kept", "dropped"],
            [
                [
                    str(g.index),
                    str(g.steps),
                    str(len(set(g.measured) | set(g.dropped))),
                    str(len(g.kept)),
                    str(len(g.dropped)),
                ]
                for g in state.rungs
            ],
        )
    )
    dropped = [[label(tid), why] for g in state.rungs for tid, why in sorted(g.dropped.items())]
    skipped = [[label(tid), why] for tid, why in sorted(state.skipped.items())]
    if skipped:
        sec.tables.append(Table(["configuration", "reason"], skipped, "Skipped by prediction"))
    if dropped:
        sec.tables.append(Table(["configuration", "reason"], dropped, "Dropped"))
    ranking = state.ranking()
    if ranking:
        sec.tables.append(
            Table(
                ["configuration", "rung reached", "objective", "runs", "against the best"],
                [
                    [label(t), str(k), _number(v), *_against_best(state, t, k)]
                    for t, k, v in ranking[:_MAX_LISTED]
                ],
                "Final ranking (deepest rung first, then the median objective)",
            )
        )
    last = state.rungs[-1] if state.rungs else None
    if last is not None and last.index == len(state.steps) - 1 and last.tied:
        single = len(last.repeats[last.measured[0]]) == 1
        sec.paras.append(
            f"{len(last.tied)} finalist(s) cannot be told apart from the best: "
            + (
                "within two standard errors of one run's per-step times, which do not see the "
                "noise between runs; search.final_repeats: 3 measures each finalist three "
                "times, interleaved, and ranks by the median."
                if single
                else "their medians differ from the best's by less than the wider range of "
                "their runs."
            )
        )
    return sec


def _number(v: float) -> str:
    """An objective as people read it: 87,152 (samples/s), 0.0123 (1/s to target)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _against_best(state: SearchState, tid: str, rung_index: int) -> list[str]:
    """A ranked configuration's runs in the rung it reached, and how it compares with the best
    of the last rung (search.halving.indistinct) or where it stopped."""
    rung = state.rungs[rung_index]
    runs = rung.repeats.get(tid, [])
    count = (
        str(len(runs)) if len(runs) < 2 else f"{len(runs)}: {_number(runs[0])}-{_number(runs[-1])}"
    )
    if rung_index != len(state.steps) - 1:
        return [count, f"stopped at rung {rung_index}"]
    best = rung.measured[0]
    if tid == best:
        return [count, "best"]
    slower = 1 - rung.values[tid] / rung.values[best]
    tied = " (not measurably different)" if tid in rung.tied else ""
    return [count, f"{slower:.1%} below{tied}"]


def _summary(r: Report) -> Section:
    ok = sum(1 for c in r.configs if c.ok)
    sec = Section("summary", f"Sweep {r.name}")
    sec.paras.append(scaling_statement(r))
    sec.paras.append(
        f"{r.row_count} result rows, {len(r.configs)} configurations ({ok} with ok runs), "
        f"up to {r.max_repeats} repeat(s) each. {SPREAD_NOTE}."
    )
    sec.bullets = list(r.notes)
    if r.configs and not ok:
        sec.paras.insert(0, NOTHING_OK)
    return sec


#: The report's first words when no trial ran ok.
NOTHING_OK = (
    "No trial ran ok: nothing is ranked, recommended or modelled. The failures below say why, "
    "a failure in your workload's code with its file and line."
)


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
    """One table per curve, in the overview's order, each with its own notes."""
    sec = Section("scaling", "Speedup against ideal")
    if not r.curves:
        sec.paras.append("No ok runs: nothing to scale.")
    sec.tables += [curve_table(curve) for curve in r.curves]
    if r.curves:
        sec.paras.append(
            "No-comm ceiling: the same settings with sync none (each worker trains alone), so "
            "efficiency = (ceiling/p: hardware contention) x (of ceiling: communication). "
            "Karp-Flatt e = (1/S - 1/p)/(1 - 1/p); Amdahl fit S(p) = 1/(s + (1-s)/p) by least "
            "squares on S."
        )
    return sec


def curve_table(curve: Curve) -> Table:
    """A curve's speedup against both ideals per device count, its fit and ceiling notes."""
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
        if curve.unwrapped is not None:
            su = pt.speedup_unwrapped
            rows[-1].append(times(su.median if su else None, su))
    headers = ["devices", "samples/s", "spread", "speedup", "linear ideal", "no-comm ceiling"]
    headers += ["efficiency", "of ceiling", "Karp-Flatt e"]
    if curve.unwrapped is not None:
        headers.append("speedup vs 1 device, no wrapper")
    return Table(headers, rows, title=curve.label, notes=_curve_notes(curve))


def baseline_notes(curve: Curve) -> list[str]:
    """Which 1-device run the speedup divides by; where the run without a wrapper (sync none,
    as people train on one device) differs beyond the spread, both and by how much."""
    head, base, none = curve.label, curve.baseline, curve.unwrapped
    out = [f"{head}: speedup divides by {curve.baseline_text}"]
    if base is None or none is None or not base.perf or not none.perf:
        return out
    gap = none.perf.median / base.perf.median - 1
    last = curve.points[-1]
    both = ""
    if last.devices > 1 and last.speedup and last.speedup_unwrapped:
        both = (
            f": at p={last.devices} the speedup is {last.speedup.median:.2f}x against it and "
            f"{last.speedup_unwrapped.median:.2f}x against the run without a wrapper"
        )
    out.append(
        f"{head}: the 1-device run without a wrapper (sync none) is {abs(gap):.1%} "
        f"{'faster' if gap > 0 else 'slower'} than the 1-device {base.sync} run, beyond the "
        f"spread ({spread(base.perf)} and "
        f"{spread(none.perf)}){both}; the last column divides by it"
    )
    return out


def _curve_notes(curve: Curve) -> list[str]:
    out = []
    head = curve.label
    if curve.baseline_note:
        out.append(f"{head}: {curve.baseline_note}")
    out += baseline_notes(curve)
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
            out.append(
                f"{head}: PROJECTION from the Amdahl fit, not measured: {proj} (a descriptive "
                "extrapolation of the measured curve; the prediction is the step-time model's, "
                "under Predicted vs measured)"
            )
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


#: Where the MFU numerator's FLOPs per sample come from (worker/flops.py).
_FLOPS_TEXT = (
    "Achieved FLOP/s = throughput x the model's FLOPs per sample, counted by torch's "
    "FlopCounterMode over one training step (forward, loss, backward) unless the workload's "
    "stated figure overrides it (the flops_source column). MFU counts the model's FLOPs (PaLM, "
    "appendix B); HFU, where shown, adds what the kernels recompute (fused attention's "
    "backward recomputes the scores)."
)


def _hfu_cell(c: Config, hfu: Stat | None) -> str:
    """HFU where the kernels recompute; "= MFU" only where the counted figure says they do
    not (an HFU is null also where MFU uses a stated figure, or is unknown)."""
    if hfu:
        return f"{hfu.median:.1%}"
    counted = any(r.get("flops_source") == "counted" for r in c.ok_rows)
    return "= MFU" if counted else "n/a"


def _efficiency(r: Report) -> Section:
    sec = Section("efficiency", "Hardware efficiency and memory")
    cal = r.calibration
    if cal and cal.peak_flops:
        peaks = ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in cal.peak_flops.items())
        sec.paras.append(
            "MFU = achieved FLOP/s / (p x peak), peak = each trial's own measured matmul FLOP/s "
            "at its precision (or the peak a simulated device's workload states), else "
            f"calibration.json's: {peaks} "
            f"({cal.peak_source or 'source not stated'}). {_FLOPS_TEXT}"
        )
    else:
        sec.paras.append(
            "MFU = achieved FLOP/s / (p x peak), peak = each trial's own measured matmul FLOP/s "
            "at its precision (the same probe as `platform calibrate`; a simulated device's "
            f"workload states its own). {_FLOPS_TEXT}"
        )
    rows = []
    with_hfu = any(d.config.stat("hfu") for d in r.diagnoses)
    for d in r.diagnoses:
        c = d.config
        flops = c.stat("achieved_flops")
        mem = c.stat("peak_mem_bytes")
        comp = c.stat("compile_s")
        hfu = c.stat("hfu")
        rows.append(
            [
                c.label,
                f"{flops.median / 1e9:,.2f}" if flops else "n/a",
                f"{d.mfu:.1%} ({d.mfu_peak})" if d.mfu is not None else "n/a",
                *([_hfu_cell(c, hfu)] if with_hfu else []),
                mib(mem.median) if mem else "n/a",
                spread(mem),
                f"{comp.median:.2f}" if comp else "n/a",
            ]
        )
    if rows:
        header = ["configuration", "achieved GFLOP/s", "MFU", *(["HFU"] if with_hfu else [])]
        header += ["peak memory / device MiB", "memory spread", "compile s"]
        sec.tables.append(Table(header, rows))
    if any(d.mfu is not None and d.mfu > 1 for d in r.diagnoses):
        sec.bullets.append(
            "MFU above 100%: the workload beats the measured peak, so the peak (a square matmul "
            "on one worker) understates the device or the workload's FLOPs per sample overstate "
            "its work; read MFU as relative between configurations"
        )
    sec.bullets += flops_notes([d.config for d in r.diagnoses])
    sec.bullets += [f"batch limit: {b.text}" for b in r.batch_limits]
    return sec


def _quality(r: Report) -> Section:
    sec = Section("quality", "Training quality")
    rows = []
    for q in sorted(r.quality.values(), key=lambda q: r.ranking.position(q.config)):
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


def failures_section(r: Report) -> Section:
    """Every configuration that did not run ok, with its reason's first line (a failure in the
    workload's code ends with its file, line and function: worker/failure_site.py)."""
    sec = Section("failures", "Failed, out-of-memory, diverged and refused trials")
    rows = [[f.label, f.status, str(f.count), f.reason] for f in r.failures]
    if rows:
        sec.tables.append(Table(["configuration", "status", "runs", "reason"], rows))
        sec.paras.append(
            "Each failure's traceback, from the frame in your code on, is the `error` column of "
            "results.parquet (`amdahl.read_results(DIR)`; its second line is the file's full path)."
        )
    else:
        sec.paras.append("Every trial ran ok.")
    return sec
