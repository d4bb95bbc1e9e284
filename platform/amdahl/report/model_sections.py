"""The report's sections that hold a model against measurement: "Communication" (the ring
all-reduce's alpha-beta prediction against the exposed communication measured against sync none)
and "Predicted vs measured" (the step-time model of analysis/stepmodel.py, fitted once by the
report's build and held as `Report.predicted`); and the model's texts that `platform predict`'s
document (prediction_document.py) shares.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from amdahl.analysis.comm import CommModel
from amdahl.analysis.configs import NO_SYNC
from amdahl.analysis.prediction import PredictedRow, project_curve
from amdahl.analysis.scaling import PROJECTION_FACTORS, Curve
from amdahl.analysis.selfcheck import LooPoint, error_summary
from amdahl.analysis.stepmodel import Family, StepModel
from amdahl.report.build import Report
from amdahl.report.diagnose import Diagnosis
from amdahl.report.document import Footnotes, Section, Table, mib, ms, pct, rate, spread, times
from amdahl.report.predict import PredictedView
from amdahl.sweepdir.layout import SweepDir

# --------------------------------------------------------------------------- communication

_COMM_HEADERS = [
    "configuration",
    "gradient MiB",
    "predicted ms",
    "measured exposed ms",
    "spread",
    "measured/predicted",
    "traced comm ms",
    "overlapped",
    "straggler",
]


def communication_section(r: Report) -> Section:
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
    sec.paras.append(
        "From the profiler traces (train.profile_steps steps after the measured window, per "
        "rank; traces/ in the sweep directory): traced comm = the collectives' time per step "
        "(NCCL kernels, or gloo's collectives on CPU); overlapped = the share of it during "
        "which computation ran too (Holistic Trace Analysis's definition; on a CPU the two "
        "share cores, so concurrent, not free); straggler = the rank with the least exposed "
        "communication, which the others wait for, and their extra wait per step. Medians "
        "over ranks and repeats."
    )
    sec.links = trace_links(compared)
    if sec.links:
        sec.paras.append(
            "Each rank's trace of the first repeat profiled (gzip-compressed Chrome trace "
            "JSON): open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing; "
            "the traces of every repeat are in traces/<trial id>/ and on the trial's MLflow run."
        )
    if not any(d.grad_bytes for d in r.diagnoses):
        sec.paras.append(
            "Gradient bytes unknown (not in calibration.json): no prediction. "
            "`platform calibrate` records them when the sweep directory has spec.yaml."
        )
    return sec


def trace_links(compared: list[Diagnosis]) -> list[tuple[str, str]]:
    """One link per rank to the traces of each configuration's first profiled row (its
    `trace_dir`, relative to the sweep directory, where the report files are)."""
    links = []
    for d in compared:
        traced = [row for row in d.config.ok_rows if row.get("trace_dir")]
        if not traced:
            continue
        row = traced[0]
        for rank in range(int(row["devices"])):
            path = f"{row['trace_dir']}/{SweepDir.trace_file(rank)}"
            links.append((f"{d.config.label}: rank {rank} trace", path))
    return links


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
        f"{fit}). This table's ring uses them at every p; the step-time model (Predicted "
        f"vs measured) does not: {r.predicted.model.comm.growth()}."
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
        *_trace_cells(d),
    ]


def _trace_cells(d: Diagnosis) -> list[str]:
    """What the profiler traces say: communication per step, the share of it overlapped by
    computation, and the straggler (the rank the others wait for, and how long per step)."""
    traced, overlap, straggler = d.comm_trace, d.overlap, d.straggler
    return [
        ms(traced.median) if traced is not None else "",
        pct(overlap.median) if overlap is not None else "",
        f"rank {straggler[0]} (+{ms(straggler[1])})" if straggler is not None else "",
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
    "Step-time model (analysis/stepmodel.py): compute T_c(b, p) = a_p + b_p x b per "
    "configuration family (every setting but devices and batch), fitted on the sync none trials "
    "(no communication, no wrapper) at each measured device count p (kappa: their contention "
    "against 1 device), plus omega, the strategy's wrapper per step (its 1-device trials minus "
    "the sync none line: DDP's reducer runs on one device too); communication T_n = latency "
    "terms x alpha + bytes per step / B, the bytes set by the sync strategy and its options, x "
    "theta (what the strategy's communication costs against the calibrated collective); step = "
    "(T_c^gamma + T_n^gamma)^(1/gamma) with the overlap exponent gamma; gamma and theta fitted "
    "per strategy on multi-device trials (gamma 1 where the gradient fits one DDP bucket: its "
    "all-reduce starts when the backward ends); plus the family's measured data wait (not "
    "modelled). "
    "Throughput = global batch / step."
)

BOUND_RULE = (
    "A fitted parameter on a bound of its range (theta at 1/4 or 16, a fitted kappa at 1/4 or "
    "4, a compute line's intercept or slope forced to 0) is a failed fit: the model does not "
    "describe those trials, and every prediction that uses it is withheld. gamma's ends (1: no "
    "overlap, 8: full overlap) are states a system can be in, not failures."
)


def failed_fit_notes(model: StepModel) -> list[str]:
    """One line per failed fit: the family, the parameter, the bound and what it means."""
    return [
        f"FAILED FIT, {fam.label}: {hit.text()}; its predictions that use "
        f"{'it' if hit.scope == 'compute' else 'communication'} are withheld"
        for fam in model.families.values()
        for hit in fam.hits
    ]


def predicted_section(r: Report) -> Section:
    """The model's terms, each measured point against the model refitted without it, and the
    model's projection of each curve to more devices beside the Amdahl fit's."""
    sec = Section("predicted", "Predicted vs measured")
    view = r.predicted
    sec.paras.append(MODEL_TEXT)
    sec.paras.append(BOUND_RULE)
    sec.paras.append(links_text(view.model.comm))
    sec.bullets += failed_fit_notes(view.model)
    terms = _terms_table(view.model)
    if terms.rows:
        sec.tables.append(terms)
    if not view.loo:
        sec.paras.append("No ok runs: nothing to fit the model to.")
        return sec
    sec.tables.append(_loo_table(view.loo))
    sec.paras.append(loo_caveat(view.loo))
    projection = _projection_table(r.curves, view)
    if projection.rows:
        sec.tables.append(projection)
        sec.paras.append(
            "The projection to more devices is the step-time model's prediction, with the 80% "
            f"interval {INTERVAL_RULE}; the Amdahl fit "
            "beside it (Speedup against ideal) describes the measured curve and is shown for "
            "comparison only. Speedup is against the measured 1-device run where there is one."
        )
    sec.bullets += model_caveats(view.model)
    return sec


def _loo_table(loo: list[LooPoint]) -> Table:
    rows = [
        [
            pt.config.label,
            rate(pt.measured),
            rate(pt.predicted),
            f"{pt.error:+.1%}" if pt.error is not None else "",
            "FAILED FIT (withheld in predictions): " + "; ".join(pt.failed_fit)
            if pt.failed_fit
            else pt.unknown or pt.note,
        ]
        for pt in loo
    ]
    return Table(
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


#: How every prediction's 80% interval is made, for the documents (analysis/intervals.py).
INTERVAL_RULE = (
    "the sweep's own errors at the prediction's distance set (leave-one-out inside the measured "
    "counts, the extrapolation check nearest at or beyond it, grown past the farthest), with "
    "the repeats' spread; beyond every check it is at least the simulated held-out sets' 80% "
    "bound; where the cores' load or a regime never measured is extrapolated, its low end is at "
    "least the 80% bound of the held-out set measured with ranks like these, and it spans "
    "gloo's link held at its widest calibration where the law above the cores is extrapolated"
)
#: The column of a prediction's 80% interval (analysis/intervals.py).
INTERVAL_HEADER = "80% interval samples/s"


def interval_cell(pr: PredictedRow) -> str:
    """The throughput's 80% interval as `low-high`; empty without a prediction."""
    if pr.throughput_low is None or pr.throughput_high is None:
        return ""
    return f"{rate(pr.throughput_low)} to {rate(pr.throughput_high)}"


def _projection_table(curves: list[Curve], view: PredictedView) -> Table:
    """Each curve's last measured configuration at the Amdahl projection's device counts (or
    PROJECTION_FACTORS times its devices), as the step-time model predicts it, with its 80%
    interval and, beyond the measured counts, how far out it is and what was checked there: the
    caveats numbered once below the table (`Footnotes`), each row citing its own."""
    rows, footnotes = [], Footnotes()
    for curve in curves:
        last = curve.points[-1].config
        devices = [p.devices for p in curve.projections] or [
            k * last.devices for k in PROJECTION_FACTORS
        ]
        amdahl = {p.devices: p.speedup for p in curve.projections}
        projected = project_curve(
            view.model, last, curve.baseline, devices, view.evidence, view.checks
        )
        for pr in projected:
            pred = pr.prediction
            rows.append(
                [
                    curve.label,
                    str(pr.devices),
                    rate(pred.throughput),
                    interval_cell(pr),
                    times(pr.speedup) if pr.speedup else "n/a",
                    pct(pr.efficiency),
                    times(amdahl[pr.devices]) if pr.devices in amdahl else "",
                    pred.unknown or _cited(footnotes.cite(pred.caveats)),
                ]
            )
    headers = ["configuration", "devices", "predicted samples/s", INTERVAL_HEADER]
    headers += ["predicted speedup", "predicted efficiency", "Amdahl fit speedup (descriptive)"]
    headers += ["note"]
    title = "PREDICTION from the step-time model, not measured: more devices"
    return Table(headers, rows, title=title, notes=footnotes.notes)


def _cited(numbers: str) -> str:
    return f"caveats {numbers} below" if numbers else ""


def links_text(comm: CommModel) -> str:
    if comm.intra is None:
        return (
            "No calibration.json with alpha and bandwidth: no communication model, so only "
            "what does not communicate (1 device, sync none) is predicted; run `platform "
            "calibrate DIR --devices N`."
        )
    source = f"; reused from {comm.reused_from}, same cluster shape" if comm.reused_from else ""
    text = (
        f"alpha = {comm.intra.alpha_s * 1e6:,.1f} us, B = {comm.intra.bandwidth_Bps / 1e9:.3f} "
        f"GB/s within a node ({comm.backend or '?'}, calibration.json{source})"
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


def _terms_table(model: StepModel) -> Table:
    rows = []
    for fam in model.families.values():
        if not fam.has_compute:
            rows.append([fam.label, "n/a", "n/a", "", "", "", "", "", "no compute measured"])
            continue
        rows.append(
            [
                fam.label,
                ms(fam.a_c),
                f"{fam.b_c * 1e6:,.3f}",
                f"{fam.kappa:.2f}",
                ms(fam.wrapper_s),
                f"{fam.gamma:.2f}",
                f"{fam.theta:.2f}",
                mib(fam.grad_bytes) if fam.grad_bytes else "unknown",
                _failed_prefix(fam) + f"compute: {fam.compute_source}; kappa: "
                f"{fam.kappa_source}; omega: {fam.wrapper_source}; gamma: {fam.gamma_source}"
                + (f"; {fam.contention.describe()}" if fam.contention else ""),
            ]
        )
    headers = [
        "configuration",
        "a_c ms",
        "b_c us/sample",
        "kappa",
        "omega ms",
        "gamma",
        "theta",
        "gradient MiB",
    ]
    return Table([*headers, "note"], rows, title="Fitted terms per configuration family")


def _failed_prefix(fam: Family) -> str:
    if not fam.hits:
        return ""
    return "FAILED FIT: " + ", ".join(f"{h.parameter} at {h.bound:g}" for h in fam.hits) + "; "


def loo_caveat(loo: list[LooPoint]) -> str:
    errors = error_summary(loo)
    if errors is None:
        return (
            "No multi-device point could be predicted leave-one-out: the model's error is "
            "unknown, so read its predictions as unchecked."
        )
    median, p90, n = errors
    failed = sum(1 for p in loo if p.failed_fit)
    counted = (
        f" ({failed} of them from a failed fit, counted here, withheld in predictions)"
        if failed
        else ""
    )
    return (
        f"Leave-one-out check: median |error| {median:.1%}, p90 {p90:.1%} over {n} measured "
        f"multi-device point(s){counted}: the error inside the measured device counts only; "
        "beyond them each prediction says how far out it is and what was checked there."
    )


def model_caveats(model: StepModel) -> list[str]:
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


def family_terms(fam: Family) -> str:
    if not fam.has_compute:
        return "Fitted terms: none (no compute measured in this family or its sync none sibling)."
    text = (
        f"Fitted terms: a_c = {ms(fam.a_c)} ms, b_c = {fam.b_c * 1e6:,.3f} us/sample "
        f"(compute: {fam.compute_source}); kappa = {fam.kappa:.2f} ({fam.kappa_source}); "
        f"omega = {ms(fam.wrapper_s)} ms ({fam.wrapper_source}); "
        f"gamma = {fam.gamma:.2f}, theta = {fam.theta:.2f} ({fam.gamma_source})"
    )
    if fam.grad_bytes:
        text += f"; gradient {mib(fam.grad_bytes)} MiB"
    if fam.contention:
        text += f"; {fam.contention.describe()}"
    text += "."
    if fam.hits:
        text += " FAILED FIT: " + "; ".join(h.text() for h in fam.hits) + "."
    return text
