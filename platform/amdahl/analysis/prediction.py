"""The fitted step-time model put to use: its leave-one-out accuracy over the measured
configurations, and its predictions of a sweep's families at device counts, batch sizes and node
counts the sweep did not measure (`platform predict`, the report's projected curves).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import Oversubscribed
from amdahl.analysis.configs import NO_SYNC, Config, config_options, scale_batch
from amdahl.analysis.cost import cost_per_million, device_hours_per_million
from amdahl.analysis.intervals import (
    Evidence,
    HeldOut,
    Interval,
    evidence_of,
    extrapolated_band,
    held_out_evidence,
)
from amdahl.analysis.memory_model import predict_peak
from amdahl.analysis.points import (
    FAMILY_SETTINGS,
    Point,
    family_key,
    nodes_of,
)
from amdahl.analysis.stats import differs
from amdahl.analysis.stepmodel import (
    Family,
    ModelInputs,
    Prediction,
    StepModel,
    fit,
)

# --------------------------------------------------------------------------- leave one out


@dataclass(frozen=True)
class LooPoint:
    """A measured configuration against the model refitted without it."""

    config: Config
    measured: float  # samples/s
    predicted: float | None
    unknown: str = ""
    failed_fit: tuple[str, ...] = ()  # the refit's failed fits this prediction used

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def leave_one_out(inputs: ModelInputs, min_devices: int = 2) -> list[LooPoint]:
    """For each measured point on `min_devices` or more devices: refit without it and without
    its twin (`_twins`), predict it. A prediction from a failed fit is made (and marked) here,
    not withheld: the check of the model counts its failures."""
    points = inputs.points()
    out = []
    for pt in points:
        if pt.devices < min_devices:
            continue
        model = fit(inputs, [q for q in points if q is not pt and not _twins(pt, q)])
        fam = model.families[pt.family]
        pred = model.predict(fam, pt.devices, pt.batch, pt.nodes, withhold=False)
        out.append(
            LooPoint(pt.config, pt.throughput, pred.throughput, pred.unknown, pred.failed_fit)
        )
    return out


def _twins(a: Point, b: Point) -> bool:
    """Whether `b` is `a`'s twin: the same settings at the same devices, batch and nodes, one of
    the two with `sync: none`. Left in, the twin hands the refit the left-out point's compute
    (measured there, not predicted), so a leave-one-out check would test only the
    communication term."""
    if (a.devices, a.batch, a.nodes) != (b.devices, b.batch, b.nodes) or a.family == b.family:
        return False
    i = FAMILY_SETTINGS.index("sync")
    same_rest = a.family[:i] + a.family[i + 1 :] == b.family[:i] + b.family[i + 1 :]
    return same_rest and NO_SYNC in (a.family[i], b.family[i])


@dataclass(frozen=True)
class Extrapolation:
    """The model's measured error beyond what it was fitted on: refitted on the device counts up
    to `fitted_max` only and asked for `held_out`, a wider count the sweep measured; the
    calibration without the device counts above the fit too, where it measured two or more up
    to there (`calibrated_max`), else as it is."""

    fitted_max: int  # the widest device count left in the fit
    held_out: int  # the device count predicted
    median: float
    p90: float
    points: int
    calibrated_max: int | None = None  # the widest calibrated device count the check used
    errors: tuple[float, ...] = ()  # each predicted point's |relative error|, sorted

    @property
    def distance(self) -> float:
        """How far out the check predicted: held-out over the widest fitted count."""
        return self.held_out / self.fitted_max


def extrapolation_checks(inputs: ModelInputs) -> list[Extrapolation]:
    """Every check the sweep's device counts allow: for each count c between the narrowest and
    the widest, fit on the counts up to c (1 among them) and predict each wider one, so a
    sweep at 1, 2, 4 and 8 devices measures the error 2x out twice (2 -> 4, 4 -> 8) and 4x out
    once (2 -> 8). Empty where it measured fewer than three device counts, or none at 1."""
    points = inputs.points()
    counts = sorted({pt.devices for pt in points})
    if len(counts) < 3 or counts[0] != 1:
        return []
    checks = []
    for cut in counts[1:-1]:
        narrowed = calibration_up_to(inputs.calibration, cut)
        check = dataclasses.replace(inputs, calibration=narrowed) if narrowed else inputs
        model = fit(check, [pt for pt in points if pt.devices <= cut])
        cal = check.calibration
        for held in (c for c in counts if c > cut):
            errors = sorted(_errors_at(model, points, held))
            if errors:
                checks.append(
                    Extrapolation(
                        cut,
                        held,
                        statistics.median(errors),
                        quantile(errors, 0.9),
                        len(errors),
                        cal.devices if cal else None,
                        tuple(errors),
                    )
                )
    return checks


def _errors_at(model: StepModel, points: list[Point], held: int) -> list[float]:
    """|relative error| of `model` at each measured point on `held` devices it can predict."""
    errors = []
    for pt in points:
        if pt.devices != held or pt.family not in model.families:
            continue
        pred = model.predict(
            model.families[pt.family], pt.devices, pt.batch, pt.nodes, withhold=False
        )
        if pred.throughput and pt.throughput:
            errors.append(abs(pred.throughput - pt.throughput) / pt.throughput)
    return errors


def extrapolation_check(inputs: ModelInputs) -> Extrapolation | None:
    """The headline check: fitted on every device count but the widest, predicting the widest;
    None where the sweep measured fewer than three device counts."""
    return headline_check(extrapolation_checks(inputs), inputs)


def headline_check(checks: list[Extrapolation], inputs: ModelInputs) -> Extrapolation | None:
    """Among `checks`, the one fitted on every measured device count but the widest and
    predicting the widest; None where there is none (no widest point was predictable)."""
    counts = sorted({pt.devices for pt in inputs.points()})
    wanted = (counts[-2], counts[-1]) if len(counts) >= 2 else None
    return next((c for c in checks if (c.fitted_max, c.held_out) == wanted), None)


def calibration_up_to(cal: Calibration | None, devices: int) -> Calibration | None:
    """The calibration as if measured over `devices` ranks: its fits at those device counts
    only, the widest of them as the reference; None where fewer than two are left."""
    if cal is None:
        return None
    kept = {q: v for q, v in cal.by_devices.items() if q <= devices}
    if len(kept) < 2:
        return None
    widest = max(kept)
    alpha, bandwidth = kept[widest]
    return dataclasses.replace(
        cal, alpha_s=alpha, bandwidth_Bps=bandwidth, devices=widest, by_devices=kept
    )


def beyond_measured(
    devices: int, widest: int, checks: list[Extrapolation], quoted: HeldOut | None = None
) -> str:
    """The caveat of a prediction beyond the widest measured device count: the error measured
    by the check nearest its distance (`nearest_check`) where one reaches that far; beyond
    every check, how far out it is, which check is the farthest (its error not quoted: it was
    measured nearer) and the only evidence at that distance (`held_out_evidence`, naming the
    set its regime caveat quotes, `quoted`, without repeating it)."""
    distance = devices / widest
    head = f"{devices} devices is {distance:.3g}x the widest measured ({widest})"
    check = nearest_check(distance, checks)
    if check is None:
        return (
            f"{head}; the model's error beyond its fit was not measured (that needs ok runs at "
            "1 and at least two more device counts, predictable without the widest): treat "
            f"it as unchecked; {held_out_evidence(distance, quoted)}"
        )
    if check.distance < distance - 1e-9:
        return (
            f"{head}; the farthest check: fitted up to {check.fitted_max} devices, the model "
            f"predicted {check.held_out} ({check.distance:.3g}x), nearer than this, so its "
            f"error is not quoted here; {held_out_evidence(distance, quoted)}; farther out, "
            "expect more"
        )
    said = (
        f"fitted up to {check.fitted_max} devices, the model predicted {check.held_out} "
        f"({check.distance:.3g}x) with median error {check.median:.1%}, p90 {check.p90:.1%} "
        f"over {check.points} configurations, {_calibrated_as(check)}"
    )
    return f"{head}; checked as far out: {said}"


def nearest_check(distance: float, checks: list[Extrapolation]) -> Extrapolation | None:
    """The check that speaks for a prediction `distance` times the widest measured count: the
    nearest one at least that far out (from the widest fit among equals, the closest to the
    user's), else the farthest of all (which then understates the error)."""
    covering = [c for c in checks if c.distance >= distance - 1e-9]
    if covering:
        return min(covering, key=lambda c: (c.distance, -c.fitted_max))
    return max(checks, key=lambda c: (c.distance, c.fitted_max), default=None)


def _calibrated_as(ext: Extrapolation) -> str:
    cal = ext.calibrated_max
    if cal is not None and cal < ext.held_out:
        return f"its communication extrapolated from a calibration up to {cal}"
    if cal is not None and cal > ext.held_out:
        return f"its communication calibrated up to {cal} devices, beyond the predicted count"
    return f"its communication calibrated at {ext.held_out} all the same"


def error_summary(loo: list[LooPoint], min_devices: int = 2) -> tuple[float, float, int] | None:
    """(median, p90 of |relative error|, points) over LOO points on >= min_devices devices."""
    errs = sorted(
        abs(p.error) for p in loo if p.error is not None and p.config.devices >= min_devices
    )
    if not errs:
        return None
    return statistics.median(errs), quantile(errs, 0.9), len(errs)


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


# --------------------------------------------------------------------------- sweep predictions


@dataclass(frozen=True)
class PredictedRow:
    """A family at one device count and batch (the grid's meaning: per device under weak
    scaling, global under strong), against its 1-device throughput."""

    devices: int
    batch: int
    prediction: Prediction
    baseline: float | None = None  # 1-device samples/s at the same batch, same sync
    baseline_measured: bool = False
    price: float = 0.0
    #: The measured 1-device sync none samples/s at the same batch (no wrapper, as people
    #: train on one device), where it differs from `baseline` beyond the spread; else None.
    unwrapped: float | None = None
    #: Peak tensor bytes per device, by the memory model (None without the probe's facts).
    memory_bytes: float | None = None
    #: The throughput's 80% interval (analysis/intervals.py); None without a throughput.
    interval: Interval | None = None

    @property
    def throughput_low(self) -> float | None:
        return self.interval.low if self.interval else None

    @property
    def throughput_high(self) -> float | None:
        return self.interval.high if self.interval else None

    @property
    def step_s_range(self) -> tuple[float, float] | None:
        """The step time's 80% interval (the throughput's, inverted)."""
        step = self.prediction.step_s
        if self.interval is None or step is None:
            return None
        return self.interval.inverse(step)

    @property
    def speedup(self) -> float | None:
        x = self.prediction.throughput
        return x / self.baseline if x and self.baseline else None

    @property
    def efficiency(self) -> float | None:
        s = self.speedup
        return s / self.devices if s is not None else None

    @property
    def speedup_unwrapped(self) -> float | None:
        """Against the 1-device run without the strategy's wrapper (where it differs)."""
        x = self.prediction.throughput
        return x / self.unwrapped if x and self.unwrapped else None

    @property
    def cost(self) -> float | None:
        """$ per million samples at the sweep's price, else device-hours per million."""
        x = self.prediction.throughput
        if not x:
            return None
        if self.price > 0:
            return cost_per_million(self.devices, x, self.price)
        return device_hours_per_million(self.devices, x)


@dataclass
class FamilyPrediction:
    family: Family
    rows: list[PredictedRow]
    #: the device counts this family has ok runs at
    measured_devices: list[int] = field(default_factory=list)


@dataclass
class SweepPrediction:
    name: str
    model: StepModel
    families: list[FamilyPrediction]
    loo: list[LooPoint]
    price: float
    nodes: int
    notes: list[str] = field(default_factory=list)
    #: The model's measured error predicting device counts it was not fitted on: every check
    #: the sweep's counts allow (extrapolation_checks), and the headline one among them
    extrapolations: list[Extrapolation] = field(default_factory=list)
    extrapolation: Extrapolation | None = None

    @property
    def errors(self) -> tuple[float, float, int] | None:
        return error_summary(self.loo)

    def as_dict(self) -> dict[str, Any]:
        """Every prediction with its terms and caveats, the model's measured error and the
        device counts it was measured and calibrated at: `platform predict --json`."""
        errors = self.errors
        comm = self.model.comm
        return {
            "sweep": self.name,
            "nodes": self.nodes,
            "notes": list(self.notes),
            "leave_one_out": (
                {"median": errors[0], "p90": errors[1], "points": errors[2]} if errors else None
            ),
            "calibration": {
                "alpha_s": comm.intra.alpha_s if comm.intra else None,
                "bandwidth_Bps": comm.intra.bandwidth_Bps if comm.intra else None,
                "calibrated_devices": comm.calibrated_devices,
                "calibrated_range": list(comm.calibrated_range) if comm.calibrated_range else None,
                "alpha_exponent": comm.alpha_exp,
                "bandwidth_exponent": comm.bandwidth_exp,
                "growth": comm.growth(),
                "oversubscribed": _oversubscribed_dict(comm.oversubscribed),
                "backend": comm.backend or None,
            },
            "extrapolation": dataclasses.asdict(self.extrapolation) if self.extrapolation else None,
            "extrapolation_checks": [
                {**dataclasses.asdict(c), "distance": c.distance} for c in self.extrapolations
            ],
            "families": [_family_dict(f) for f in self.families],
        }


def _oversubscribed_dict(over: Oversubscribed | None) -> dict[str, Any] | None:
    """gloo's law above the node's cores (analysis/comm.py), for scripts; None without one."""
    if over is None:
        return None
    return {
        "cores": over.cores,
        "alpha_log": over.alpha_log,
        "bandwidth_exponent": over.bandwidth_exp,
        "anchor_alpha_s": over.anchor.alpha_s,
        "anchor_bandwidth_Bps": over.anchor.bandwidth_Bps,
        "calibrated_counts": list(over.counts),
    }


def _family_dict(fp: FamilyPrediction) -> dict[str, Any]:
    fam = fp.family
    return {
        "label": fam.label,
        "settings": fam.settings,
        "measured_devices": fp.measured_devices,
        "terms": {
            "a_c_s": fam.a_c,
            "b_c_s_per_sample": fam.b_c,
            "kappa": fam.kappa,
            "wrapper_s": fam.wrapper_s,
            "gamma": fam.gamma,
            "theta": fam.theta,
            "grad_bytes": fam.grad_bytes,
            "effective_cores": fam.contention.cores if fam.contention else None,
            "host_cpu_share": dict(fam.contention.share.shares) if fam.contention else None,
        },
        "sources": {
            "compute": fam.compute_source,
            "gamma_theta": fam.gamma_source,
            "contention": fam.contention.describe() if fam.contention else None,
        },
        "failed_fits": [h.text() for h in fam.hits],
        "predictions": [_row_dict(r) for r in fp.rows],
    }


def _row_dict(r: PredictedRow) -> dict[str, Any]:
    pred = r.prediction
    steps = r.step_s_range
    return {
        "devices": r.devices,
        "batch": r.batch,
        "throughput": pred.throughput,
        "throughput_low": r.throughput_low,
        "throughput_high": r.throughput_high,
        "interval_basis": r.interval.basis if r.interval else None,
        "speedup": r.speedup,
        "efficiency": r.efficiency,
        "baseline_measured": r.baseline_measured,
        "step_s": pred.step_s,
        "step_s_low": steps[0] if steps else None,
        "step_s_high": steps[1] if steps else None,
        "compute_s": pred.compute_s,
        "comm_s": pred.comm_s,
        "data_wait_s": pred.data_wait_s,
        "peak_mem_bytes": r.memory_bytes,
        "cost": r.cost,
        "cost_unit": "$ per million samples" if r.price > 0 else "device-hours per million",
        "caveats": list(pred.caveats),
        "failed_fit": list(pred.failed_fit),
        "unknown": pred.unknown or None,
    }


def predict_inputs(
    inputs: ModelInputs,
    devices: list[int],
    batch_sizes: list[int] | None = None,
    nodes: int = 1,
) -> SweepPrediction:
    model = fit(inputs)
    measured = {pt.config.key: pt for pt in inputs.points()}
    by_family: dict[tuple, list[Config]] = {}
    for c in inputs.configs:
        by_family.setdefault(family_key(c.settings), []).append(c)
    out = SweepPrediction(inputs.name, model, [], leave_one_out(inputs), inputs.price, nodes)
    out.notes = list(inputs.notes)
    out.extrapolations = extrapolation_checks(inputs)
    out.extrapolation = headline_check(out.extrapolations, inputs)
    evidence = evidence_of(inputs, out.loo, out.extrapolations)
    widest = evidence.widest
    points = inputs.points()
    if model.comm.intra is None:
        out.notes.append(
            "no calibration.json with alpha and bandwidth: no communication model, so only "
            "sync none (no communication) can be predicted; run `platform calibrate DIR "
            "--devices N` first"
        )
    for key, fam in model.families.items():
        configs = by_family.get(key, [])
        memory = _memory_of(inputs, fam)
        none = by_family.get(sibling_key(key), []) if fam.sync != NO_SYNC else []
        batches = batch_sizes or sorted(
            {scale_batch(c.settings) for c in configs if c.ok and c.batch_size}
        )
        rows = []
        for b in batches:
            one_config = _one_device(configs, b)
            one = measured.get(one_config.key) if one_config else None
            base_pred = model.predict(fam, 1, float(b), 1)
            baseline = one.throughput if one else base_pred.throughput
            unwrapped = unwrapped_baseline(one_config, _one_device(none, b))
            for p in devices:
                per_device = b / p if fam.scaling == "strong" else float(b)
                pred = model.predict(fam, p, per_device, nodes)
                wide = extrapolated_band(model, fam, points, pred, per_device, nodes, evidence)
                if p > widest:
                    caveat = beyond_measured(p, widest, out.extrapolations, wide.quoted)
                    pred = dataclasses.replace(pred, caveats=(*pred.caveats, caveat))
                pred = dataclasses.replace(pred, caveats=(*pred.caveats, *wide.caveats))
                rows.append(
                    PredictedRow(
                        p,
                        b,
                        pred,
                        baseline,
                        one is not None,
                        inputs.price,
                        unwrapped=unwrapped,
                        memory_bytes=memory(p, per_device),
                        interval=wide.band,
                    )
                )
        measured_at = sorted({c.devices for c in configs if c.ok})
        out.families.append(FamilyPrediction(fam, rows, measured_at))
    return out


def _memory_of(inputs: ModelInputs, fam: Family) -> Callable[[int, float], Any]:
    """(devices, per-device batch) -> the family's predicted peak bytes per device, or None
    where plan.json holds no probe facts for its parameters and precision. Its micro-steps are
    the family's own (a swept accumulate_steps), as the step-time model's."""
    settings = fam.settings
    facts = inputs.memory_facts.get((settings.get("params") or "{}", settings.get("precision")))
    if facts is None:
        return lambda devices, batch: None
    micro = int(fam.micro)
    overhead = inputs.memory_overhead_bytes
    mode = settings.get("activation_checkpointing") or "none"
    options, precision = config_options(settings), settings["precision"]
    return lambda devices, batch: (
        predict_peak(
            facts, settings["sync"], devices, batch, micro, overhead, mode, options, precision
        ).total
    )


def sibling_key(key: tuple) -> tuple:
    """The family key of the same settings with sync none."""
    i = FAMILY_SETTINGS.index("sync")
    return (*key[:i], NO_SYNC, *key[i + 1 :])


def _one_device(configs: list[Config], batch: int) -> Config | None:
    """The ok 1-device configuration at `batch` (the grid's meaning of batch)."""
    return next(
        (c for c in configs if c.devices == 1 and c.ok and scale_batch(c.settings) == batch),
        None,
    )


def unwrapped_baseline(wrapped: Config | None, none: Config | None) -> float | None:
    """The 1-device sync none throughput when it differs from the strategy's own 1-device run
    beyond the larger spread (stats.differs), else None: then one baseline says it all."""
    if wrapped is None or none is None or not wrapped.throughput or not none.throughput:
        return None
    return none.throughput.median if differs(wrapped.throughput, none.throughput) else None


def project_curve(
    model: StepModel,
    last: Config,
    baseline: Config | None,
    devices: list[int],
    evidence: Evidence | None = None,
    checks: list[Extrapolation] | None = None,
) -> list[PredictedRow]:
    """A measured curve (the family and batch of `last`, its largest measured configuration)
    predicted at more devices, against its measured 1-device `baseline` (else the model's),
    each with its 80% interval and distance caveat where the sweep's `evidence` and
    extrapolation `checks` are given."""
    fam = model.family_of(last)
    if fam is None:
        return []
    b = scale_batch(last.settings)
    base = baseline.throughput.median if baseline and baseline.throughput else None
    if base is None:
        base = model.predict(fam, 1, float(b), 1).throughput
    out = []
    for p in devices:
        per_device = b / p if fam.scaling == "strong" else float(b)
        pred = model.predict(fam, p, per_device, nodes_of(last))
        band = None
        if evidence is not None:
            wide = extrapolated_band(model, fam, [], pred, per_device, nodes_of(last), evidence)
            if p > evidence.widest:
                caveat = beyond_measured(p, evidence.widest, checks or [], wide.quoted)
                pred = dataclasses.replace(pred, caveats=(*pred.caveats, caveat))
            pred = dataclasses.replace(pred, caveats=(*pred.caveats, *wide.caveats))
            band = wide.band
        out.append(PredictedRow(p, b, pred, base, baseline is not None, interval=band))
    return out
