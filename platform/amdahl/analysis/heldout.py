"""A held-out set scored: the intervals `platform predict` gives a truth sweep's configurations
from a fit sweep's rows, against what the truth sweep measured (benchmarks/scale_check.py and
tests/unit/analysis/test_heldout_accuracy.py; docs/predicting.md, "How far to trust it").

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from amdahl.analysis.configs import Config, scale_batch
from amdahl.analysis.intervals import Interval, evidence_of, extrapolated_band
from amdahl.analysis.prediction import predict_inputs
from amdahl.analysis.stepmodel import ModelInputs


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
        band, _ = extrapolated_band(result.model, fam, points, pred, batch, 1, evidence)
        if band is not None:
            out.append((c, band))
    return out
