"""The step-time model's checks of itself on a sweep's own rows: each measured point against the
model refitted without it (leave one out), and each wider measured device count against the
model fitted on the narrower ones (the extrapolation checks), with the calibration narrowed to
match. Their errors set every prediction's interval and distance words (analysis/intervals.py);
analysis/prediction.py puts them beside the predictions.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.configs import NO_SYNC, Config
from amdahl.analysis.intervals import HeldOut, held_out_evidence
from amdahl.analysis.points import FAMILY_SETTINGS, Point
from amdahl.analysis.stepmodel import ModelInputs, StepModel, fit

# --------------------------------------------------------------------------- leave one out


@dataclass(frozen=True)
class LooPoint:
    """A measured configuration against the model refitted without it."""

    config: Config
    measured: float  # samples/s
    predicted: float | None
    unknown: str = ""
    failed_fit: tuple[str, ...] = ()  # the refit's failed fits this prediction used
    #: What the refit had to fall back on without the point, where that is what the error
    #: checks (`_fallback`).
    note: str = ""

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
        kept = [q for q in points if q is not pt and not _twins(pt, q)]
        model = fit(inputs, kept)
        fam = model.families[pt.family]
        pred = model.predict(fam, pt.devices, pt.batch, pt.nodes, withhold=False)
        out.append(
            LooPoint(
                pt.config,
                pt.throughput,
                pred.throughput,
                pred.unknown,
                pred.failed_fit,
                _fallback(pt, kept),
            )
        )
    return out


def _fallback(pt: Point, kept: list[Point]) -> str:
    """Why a 1-device point's refit is a weaker model than the fit: without it (and its twin),
    its compute line at 1 device has one batch left, so the line is taken proportional to the
    batch (computefit.fit_lines). Its error then measures that fallback, not the model a sweep
    with both batches gets."""
    if pt.devices != 1:
        return ""
    syncs = (_sync(pt.family), NO_SYNC)
    batches = {
        q.batch
        for q in kept
        if q.devices == 1
        and q.nodes == pt.nodes
        and _but_sync(q.family) == _but_sync(pt.family)
        and _sync(q.family) in syncs
    }
    if len(batches) >= 2:
        return ""
    return (
        "without it, 1-device compute is measured at one batch only and taken proportional to "
        "the batch: this checks that fallback, not the two-batch line"
    )


def _twins(a: Point, b: Point) -> bool:
    """Whether `b` is `a`'s twin: the same settings at the same devices, batch and nodes, one of
    the two with `sync: none`. Left in, the twin hands the refit the left-out point's compute
    (measured there, not predicted), so a leave-one-out check would test only the
    communication term."""
    if (a.devices, a.batch, a.nodes) != (b.devices, b.batch, b.nodes) or a.family == b.family:
        return False
    same_rest = _but_sync(a.family) == _but_sync(b.family)
    return same_rest and NO_SYNC in (_sync(a.family), _sync(b.family))


_SYNC = FAMILY_SETTINGS.index("sync")


def _sync(key: tuple) -> str:
    return key[_SYNC]


def _but_sync(key: tuple) -> tuple:
    """A family key without its sync: the settings a family shares with its sync-none twin."""
    return key[:_SYNC] + key[_SYNC + 1 :]


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
