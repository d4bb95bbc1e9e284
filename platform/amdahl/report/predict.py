"""The step-time model (analysis/stepmodel.py, which reads no files) over a sweep: its inputs from
what report/inputs.py's `load_inputs` read, the model fitted for a report (`Report.predicted`),
and `platform predict`'s predictions.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from amdahl.analysis.configs import Config, group_configs
from amdahl.analysis.intervals import Evidence, evidence_of
from amdahl.analysis.memory_model import overhead_from_rows
from amdahl.analysis.prediction import SweepPrediction, predict_inputs
from amdahl.analysis.selfcheck import Extrapolation, LooPoint, extrapolation_checks, leave_one_out
from amdahl.analysis.stepmodel import ModelInputs, StepModel, fit
from amdahl.errors import UserError
from amdahl.report.inputs import SweepInputs, load_inputs
from amdahl.sweepdir.layout import RESULTS_FILE


@dataclass
class PredictedView:
    """The step-time model fitted to a report's sweep and its leave-one-out check (every
    measured point, 1-device ones included): fitted once by the report's build, read by the
    "Predicted vs measured" section and the HTML plot; its extrapolation checks and the
    evidence they make give the projections their intervals and distance caveats."""

    model: StepModel
    loo: list[LooPoint]
    checks: list[Extrapolation]
    evidence: Evidence


def model_inputs(inputs: SweepInputs, configs: list[Config] | None = None) -> ModelInputs:
    """The model's inputs from a sweep's: its configurations (`configs` when already grouped
    from `inputs.rows`), calibration, sync options and price."""
    return ModelInputs(
        configs=group_configs(inputs.rows) if configs is None else configs,
        calibration=inputs.calibration,
        options=inputs.options,
        price=inputs.price_per_device_hour,
        name=inputs.name,
        notes=list(inputs.notes),
        memory_facts=dict(inputs.memory_facts),
        memory_overhead_bytes=overhead_from_rows(inputs.rows).bytes,
    )


def fit_view(inputs: ModelInputs) -> PredictedView:
    loo = leave_one_out(inputs, min_devices=1)
    checks = extrapolation_checks(inputs)
    return PredictedView(fit(inputs), loo, checks, evidence_of(inputs, loo, checks))


def load_model_inputs(sweep_dir: str | Path) -> ModelInputs:
    """Read a sweep directory for the model (load_inputs: results rows, calibration.json,
    spec.yaml's options and price); a directory without results.parquet is the user's error."""
    d = Path(sweep_dir)
    if not d.is_dir() or not (d / RESULTS_FILE).exists():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (expected a folder holding {RESULTS_FILE}, "
            "as written by `platform sweep`)"
        )
    return model_inputs(load_inputs(d))


def predict_sweep(
    sweep_dir: str | Path,
    devices: list[int],
    batch_sizes: list[int] | None = None,
    nodes: int = 1,
) -> SweepPrediction:
    """`platform predict`: every family at each device count and batch (default: the batches
    the family measured), with the model's leave-one-out error as its caveat."""
    inputs = load_model_inputs(sweep_dir)
    return predict_inputs(inputs, devices, batch_sizes, nodes)
