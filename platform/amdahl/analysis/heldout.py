"""A held-out set scored: the model's and the naive predictors' throughput, and the intervals
`platform predict` gives, for a truth sweep's configurations from a fit sweep's rows, against
what the truth sweep measured. One scorer for benchmarks/scale_check.py and
tests/unit/analysis/test_heldout_accuracy.py, so the figures the benchmark prints and the ledger
holds are one computation (docs/predicting.md, "How far to trust it").

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from amdahl.analysis.configs import Config, scale_batch
from amdahl.analysis.intervals import Interval, evidence_of, extrapolated_band
from amdahl.analysis.prediction import predict_inputs
from amdahl.analysis.scaling import amdahl_speedup, fit_amdahl
from amdahl.analysis.stepmodel import ModelInputs, Prediction, StepModel

#: The predictors a held-out point is scored for: the model, naive Amdahl (fitted on the fitted
#: counts' speedups, extrapolated), the naive per-device line (the widest fitted count's
#: per-device throughput times p).
PREDICTORS = ("model", "amdahl", "linear")


@dataclass(frozen=True)
class Scored:
    """A held-out configuration's measured throughput (median over its repeats) and each
    predictor's; a predictor without a figure is None."""

    config: Config
    measured: float
    prediction: Prediction | None  # the model's, made for a failed fit too (marked there)
    amdahl: float | None
    linear: float | None

    def predicted(self) -> dict[str, float | None]:
        model = self.prediction.throughput if self.prediction else None
        return {"model": model, "amdahl": self.amdahl, "linear": self.linear}

    def errors(self) -> dict[str, float]:
        """Each predictor's relative error, (predicted - measured) / measured, where it has one."""
        return {k: v / self.measured - 1 for k, v in self.predicted().items() if v is not None}


def curve_key(c: Config) -> tuple[str, int | None]:
    """What a held-out point is matched to the fitted rows by: its sync and per-device batch."""
    return (c.sync, scale_batch(c.settings))


def naive(curve: dict[int, float], p: int) -> tuple[float | None, float | None]:
    """The two naive predictions at `p` devices from a configuration's fitted throughputs by
    device count: naive Amdahl (needs 1 device and another), the per-device line."""
    amdahl = linear = None
    if 1 in curve and len(curve) >= 2:
        fitted = fit_amdahl([(q, x / curve[1]) for q, x in sorted(curve.items())])
        if fitted is not None:
            amdahl = curve[1] * amdahl_speedup(fitted.serial_fraction, p)
    if curve:
        widest = max(curve)
        linear = curve[widest] / widest * p
    return amdahl, linear


def scored_points(
    model: StepModel, fit_inputs: ModelInputs, truth_inputs: ModelInputs, devices: Iterable[int]
) -> list[Scored]:
    """Every ok configuration of the truth sweep at `devices`, measured against the `model`
    (fitted on `fit_inputs`) and the naive predictors from the fit sweep's rows."""
    wanted = set(devices)
    curves: dict[tuple, dict[int, float]] = {}
    for c in fit_inputs.configs:
        if c.ok and c.throughput:
            curves.setdefault(curve_key(c), {})[c.devices] = c.throughput.median
    out = []
    for c in truth_inputs.configs:
        if not (c.ok and c.throughput and c.devices in wanted):
            continue
        fam = model.family_of(c)
        batch = float(scale_batch(c.settings))
        pred = model.predict(fam, c.devices, batch, 1, withhold=False) if fam else None
        amdahl, linear = naive(curves.get(curve_key(c), {}), c.devices)
        out.append(Scored(c, c.throughput.median, pred, amdahl, linear))
    return out


def held_out_bands(
    fit_inputs: ModelInputs, truth_inputs: ModelInputs, devices: Iterable[int]
) -> list[tuple[Config, Interval]]:
    """Each ok configuration of a held-out truth sweep at `devices`, with the interval
    `platform predict` gives it from the fit sweep's rows (made for a prediction withheld as a
    failed fit too): how benchmarks/scale_check.py and the held-out accuracy test score the
    intervals against what was measured."""
    wanted = sorted(set(devices))
    result = predict_inputs(fit_inputs, wanted)
    evidence = evidence_of(fit_inputs, result.loo, result.extrapolations)
    points = fit_inputs.points()
    out = []
    for c in truth_inputs.configs:
        fam = result.model.family_of(c)
        if not (c.ok and c.throughput and c.devices in wanted and fam is not None):
            continue
        batch = float(scale_batch(c.settings))
        pred = result.model.predict(fam, c.devices, batch, 1, withhold=False)
        band = extrapolated_band(result.model, fam, points, pred, batch, 1, evidence).band
        if band is not None:
            out.append((c, band))
    return out
