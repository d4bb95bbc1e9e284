"""The report as a neutral document (sections of paragraphs, tables and bullets) that the
terminal, Markdown and HTML renderers all format, so the three say the same thing.

Order: scaling mode, recommendation first, then the evidence behind it.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from amdahl.analysis import stepmodel
from amdahl.analysis.compute import NO_SYNC, PROJECTION_FACTORS, SETTINGS, Config, Stat, differs
from amdahl.report.build import Report
from amdahl.report.diagnose import SEGMENTS, THRESHOLD_TEXT, Diagnosis, cost_stat
from amdahl.report.predict import report_inputs

if TYPE_CHECKING:
    from amdahl.search.halving import SearchState


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
    out += [_communication(report), _predicted(report), _efficiency(report), _quality(report)]
    if any(row.get("target") for c in report.configs for row in c.rows):
        out.append(_time_to_target(report))
    if report.search is not None:
        out.append(_search(report))
    out.append(_failures(report))
    out.append(Section("thresholds", "Thresholds used", bullets=list(THRESHOLD_TEXT)))
    return out


def _search(r: Report) -> Section:
    """search: halving: each rung (what it measured, kept and dropped, and why), what the
    step-time model skipped, and the final ranking."""
    state = r.search
    assert state is not None
    label = lambda tid: r.labels.get(tid, tid)  # noqa: E731
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
    of the last rung (search.indistinct) or where it stopped."""
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


_COMM_HEADERS = [
    "configuration",
    "gradient MiB",
    "predicted ms",
    "measured exposed ms",
    "spread",
    "measured/predicted",
]


def _communication(r: Report) -> Section:
    sec = Section("communication", "Communication: alpha-beta model against measurement")
    sec.paras.append(_ring_model_text(r))
    compared = [d for d in r.diagnoses if d.config.devices > 1 and d.config.sync != NO_SYNC]
    if not compared:
        sec.paras.append("No multi-device configuration with synchronisation in this sweep.")
        return sec
    for d in compared:
        ratio = _comm_ratio(d)
        if ratio is not None:
            sec.bullets.append(f"{d.config.label}: {_comm_verdict(ratio)}")
    sec.tables.append(Table(list(_COMM_HEADERS), [_comm_row(d) for d in compared]))
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
    return sec


def _ring_model_text(r: Report) -> str:
    """The ring model with the calibration's alpha and bandwidth, or how to measure them."""
    cal = r.calibration
    if cal is None or not cal.has_comm_model:
        return (
            "No calibration.json with alpha and bandwidth: run `platform calibrate DIR "
            "--devices N` to measure all-reduce latency and bandwidth for the ring prediction."
        )
    fit = f", fit RMS relative error {cal.fit_rel_rmse:.0%}" if cal.fit_rel_rmse is not None else ""
    return (
        f"Ring all-reduce t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth with alpha = "
        f"{cal.alpha_s * 1e6:,.1f} us and bandwidth = {cal.bandwidth_Bps / 1e9:.3f} GB/s "
        f"(measured by `platform calibrate` on {cal.devices} devices, {cal.backend or '?'}"
        f"{fit}; alpha and bandwidth are assumed the same at other p)."
    )


def _comm_ratio(d: Diagnosis) -> float | None:
    """Measured exposed communication / the ring prediction, when both are known."""
    if d.comm is None or not d.predicted_comm_s:
        return None
    return d.comm.median / d.predicted_comm_s


def _comm_row(d: Diagnosis) -> list[str]:
    measured, predicted, ratio = d.comm, d.predicted_comm_s, _comm_ratio(d)
    return [
        d.config.label,
        mib(d.grad_bytes) if d.grad_bytes else "unknown",
        ms(predicted) if predicted is not None else "",
        ms(measured.median) if measured is not None else "",
        _comm_spread(d),
        f"{ratio:.2f}" if ratio is not None else "",
    ]


def _comm_spread(d: Diagnosis) -> str:
    """The measured figure's spread, marked when it is within the noise of sync none."""
    if d.comm is None:
        return ""
    return ("" if d.comm_measurable else "no measurable") + f" {spread(d.comm)}"


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


# --------------------------------------------------------------------------- step-time model

MODEL_TEXT = (
    "Step-time model (analysis/stepmodel.py): compute T_c(b) = a_c + b_c x b per configuration "
    "family (every setting but devices and batch), x kappa on more than one device (measured "
    "contention); communication T_n = latency terms x alpha + bytes per step / B, the bytes "
    "set by the sync strategy and its options, x theta (what the strategy's communication costs "
    "against the calibrated collective); step = (T_c^gamma + T_n^gamma)^(1/gamma) with the "
    "overlap exponent gamma; gamma and theta fitted per strategy on multi-device trials; plus "
    "the family's measured data wait (not modelled). Throughput = global batch / step."
)


@dataclass
class PredictedView:
    """The step-time model fitted to a report's sweep and its leave-one-out check, computed
    once per report (each renderer reads them)."""

    inputs: stepmodel.ModelInputs
    model: stepmodel.StepModel
    loo: list[stepmodel.LooPoint]


_VIEWS: dict[int, PredictedView] = {}


def predicted_view(r: Report) -> PredictedView:
    view = _VIEWS.get(id(r))
    if view is None:
        inputs = report_inputs(r.configs, r.calibration, r.price, r.sweep_dir, r.name)
        loo = stepmodel.leave_one_out(inputs, min_devices=1)
        view = PredictedView(inputs, stepmodel.fit(inputs), loo)
        _VIEWS[id(r)] = view
        weakref.finalize(r, _VIEWS.pop, id(r), None)
    return view


def _predicted(r: Report) -> Section:
    sec = Section("predicted", "Predicted vs measured")
    view = predicted_view(r)
    sec.paras.append(MODEL_TEXT)
    sec.paras.append(_links_text(view.model.comm))
    terms = _terms_table(view.model)
    if terms.rows:
        sec.tables.append(terms)
    rows = []
    for pt in view.loo:
        rows.append(
            [
                pt.config.label,
                rate(pt.measured),
                rate(pt.predicted),
                f"{pt.error:+.1%}" if pt.error is not None else "",
                pt.unknown,
            ]
        )
    if not rows:
        sec.paras.append("No ok runs: nothing to fit the model to.")
        return sec
    sec.tables.append(
        Table(
            [
                "configuration",
                "measured samples/s",
                "predicted samples/s (leave-one-out)",
                "error",
                "note",
            ],
            rows,
            title="Each measured point against the model refitted without it",
        )
    )
    sec.paras.append(loo_caveat(view.loo))
    proj_rows = []
    for curve in r.curves:
        last = curve.points[-1].config
        devices = [p.devices for p in curve.projections] or [
            k * last.devices for k in PROJECTION_FACTORS
        ]
        amdahl = {p.devices: p.speedup for p in curve.projections}
        for pr in stepmodel.project_curve(view.model, last, curve.baseline, devices):
            pred = pr.prediction
            proj_rows.append(
                [
                    curve.label,
                    str(pr.devices),
                    rate(pred.throughput),
                    times(pr.speedup) if pr.speedup else "n/a",
                    pct(pr.efficiency),
                    times(amdahl[pr.devices]) if pr.devices in amdahl else "",
                    pred.unknown or "; ".join(pred.caveats),
                ]
            )
    if proj_rows:
        sec.tables.append(
            Table(
                [
                    "configuration",
                    "devices",
                    "predicted samples/s",
                    "predicted speedup",
                    "predicted efficiency",
                    "Amdahl fit speedup (descriptive)",
                    "note",
                ],
                proj_rows,
                title="PREDICTION from the step-time model, not measured: more devices",
            )
        )
        sec.paras.append(
            "The projection to more devices is the step-time model's prediction; the Amdahl fit "
            "beside it (Speedup against ideal) describes the measured curve and is shown for "
            "comparison only. Speedup is against the measured 1-device run where there is one."
        )
    sec.bullets += _model_caveats(view.model)
    return sec


def _links_text(comm: stepmodel.CommModel) -> str:
    if comm.intra is None:
        return (
            "No calibration.json with alpha and bandwidth: no communication model, so only "
            "what does not communicate (1 device, sync none) is predicted; run `platform "
            "calibrate DIR --devices N`."
        )
    text = (
        f"alpha = {comm.intra.alpha_s * 1e6:,.1f} us, B = {comm.intra.bandwidth_Bps / 1e9:.3f} "
        f"GB/s within a node ({comm.backend or '?'}, calibration.json)"
    )
    if comm.inter is not None:
        text += (
            f"; across nodes alpha = {comm.inter.alpha_s * 1e6:,.1f} us, B = "
            f"{comm.inter.bandwidth_Bps / 1e9:.3f} GB/s"
        )
    else:
        text += (
            "; no inter-node terms (`platform calibrate` measures within a node only): a "
            "prediction across nodes uses the intra-node ones"
        )
    return text + "."


def _terms_table(model: stepmodel.StepModel) -> Table:
    rows = []
    for fam in model.families.values():
        if not fam.has_compute:
            rows.append([fam.label, "n/a", "n/a", "", "", "", "", "no compute measured"])
            continue
        rows.append(
            [
                fam.label,
                ms(fam.a_c),
                f"{fam.b_c * 1e6:,.3f}",
                f"{fam.kappa:.2f}",
                f"{fam.gamma:.2f}",
                f"{fam.theta:.2f}",
                mib(fam.grad_bytes) if fam.grad_bytes else "unknown",
                f"compute: {fam.compute_source}; kappa: {fam.kappa_source}; "
                f"gamma: {fam.gamma_source}",
            ]
        )
    headers = [
        "configuration",
        "a_c ms",
        "b_c us/sample",
        "kappa",
        "gamma",
        "theta",
        "gradient MiB",
    ]
    return Table([*headers, "note"], rows, title="Fitted terms per configuration family")


def loo_caveat(loo: list[stepmodel.LooPoint]) -> str:
    errors = stepmodel.error_summary(loo)
    if errors is None:
        return (
            "No multi-device point could be predicted leave-one-out: the model's error is "
            "unknown, so read its predictions as unchecked."
        )
    median, p90, n = errors
    return (
        f"Leave-one-out check: median |error| {median:.1%}, p90 {p90:.1%} over {n} measured "
        "multi-device point(s); expect errors of that size or larger far from the measured "
        "range."
    )


def _model_caveats(model: stepmodel.StepModel) -> list[str]:
    out = []
    for fam in model.families.values():
        out += [f"{fam.label}: {n}" for n in fam.notes]
        if fam.sync == "powersgd" and fam.grad_bytes and not fam.shapes:
            out.append(
                f"{fam.label}: PowerSGD bytes are an estimate: no parameter shapes in "
                "calibration.json (the gradient taken as one square matrix)"
            )
        if fam.sync == "param_server":
            out.append(
                f"{fam.label}: parameter-server transfers go through Ray's object store; the "
                "calibrated collective's alpha and B stand in for it (rough)"
            )
    return out


def prediction_sections(pred: stepmodel.SweepPrediction) -> list[Section]:
    """`platform predict`: the model's terms and caveat, then one table per family."""
    head = Section("predict", f"PREDICTION for {pred.name}: step-time model, not measured")
    head.paras.append(MODEL_TEXT)
    head.paras.append(_links_text(pred.model.comm))
    head.paras.append(loo_caveat(pred.loo))
    head.paras.append(
        f"Devices spread over {pred.nodes} node(s). Speedup and efficiency are against the "
        "family's measured 1-device throughput at the same batch (the model's where none was "
        "measured)."
    )
    if pred.price <= 0:
        head.paras.append(
            "Cost: no report.cost_per_device_hour in spec.yaml, so device-hours per million "
            "samples instead of $."
        )
    head.bullets = list(pred.notes) + _model_caveats(pred.model)
    out = [head]
    cost = "predicted $/M samples" if pred.price > 0 else "predicted device-h/M samples"
    for i, fp in enumerate(pred.families):
        fam = fp.family
        sec = Section(f"predict-{i}", f"PREDICTION (not measured): {fam.label}")
        sec.paras.append(_family_terms(fam))
        rows, parts = [], []
        caveats: list[str] = []
        for pr in fp.rows:
            p = pr.prediction
            for c in p.caveats:
                if c not in caveats:
                    caveats.append(c)
            price = pr.cost
            rows.append(
                [
                    str(pr.devices),
                    str(pr.batch),
                    rate(p.throughput),
                    times(pr.speedup) if pr.speedup else "n/a",
                    pct(pr.efficiency),
                    "n/a" if price is None else f"{price:,.3g}",
                    p.unknown or ("" if pr.baseline_measured else "1-device baseline predicted"),
                ]
            )
            if p.step_s is not None:
                parts.append(
                    [str(pr.devices), str(pr.batch)]
                    + [ms(v) for v in (p.step_s, p.compute_s, p.comm_s, p.data_wait_s)]
                )
        batch = "global batch" if fam.scaling == "strong" else "batch/device"
        headers = ["devices", batch, "predicted samples/s", "predicted speedup"]
        headers += ["predicted efficiency", cost, "note"]
        if rows:
            sec.tables.append(Table(headers, rows, title="predicted, not measured"))
        else:
            sec.paras.append("No batch size to predict: the family has no ok run.")
        if parts:
            headers = ["devices", batch, "step ms", "compute ms", "comm ms", "data wait ms"]
            sec.tables.append(Table(headers, parts, title="predicted ms per optimizer step"))
        if fam.sync == NO_SYNC:
            caveats.insert(
                0,
                "sync none is the no-communication ceiling (every worker trains alone), "
                "not a way to train",
            )
        sec.bullets = caveats
        out.append(sec)
    return out


def _family_terms(fam: stepmodel.Family) -> str:
    if not fam.has_compute:
        return "Fitted terms: none (no compute measured in this family or its sync none sibling)."
    text = (
        f"Fitted terms: a_c = {ms(fam.a_c)} ms, b_c = {fam.b_c * 1e6:,.3f} us/sample "
        f"(compute: {fam.compute_source}); kappa = {fam.kappa:.2f} ({fam.kappa_source}); "
        f"gamma = {fam.gamma:.2f}, theta = {fam.theta:.2f} ({fam.gamma_source})"
    )
    if fam.grad_bytes:
        text += f"; gradient {mib(fam.grad_bytes)} MiB"
    return text + "."


def _efficiency(r: Report) -> Section:
    sec = Section("efficiency", "Hardware efficiency and memory")
    cal = r.calibration
    if cal and cal.peak_flops:
        peaks = ", ".join(f"{k} {v / 1e9:,.1f} GFLOP/s" for k, v in cal.peak_flops.items())
        sec.paras.append(
            "MFU = achieved FLOP/s / (p x peak), peak = each trial's own measured matmul FLOP/s "
            f"at its precision, else calibration.json's: {peaks} "
            f"({cal.peak_source or 'source not stated'})."
        )
    else:
        sec.paras.append(
            "MFU = achieved FLOP/s / (p x peak), peak = each trial's own measured matmul FLOP/s "
            "at its precision (the same probe as `platform calibrate`)."
        )
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
