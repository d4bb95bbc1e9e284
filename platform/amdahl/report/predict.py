"""`platform predict` and the report's model inputs: a sweep directory read for the step-time
model (analysis/stepmodel.py), which itself reads no files.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.compute import Config, group_configs
from amdahl.analysis.stepmodel import ModelInputs, SweepPrediction, SyncOptions, predict_inputs
from amdahl.errors import UserError
from amdahl.report.inputs import load_inputs
from amdahl.sweepdir.layout import CALIBRATION_FILE, RESULTS_FILE, SPEC_FILE


def load_model_inputs(sweep_dir: str | Path) -> ModelInputs:
    """Read a sweep directory for the model: results rows, calibration.json (with its optional
    inter-node and parameter-shape keys), spec.yaml's options and price."""
    d = Path(sweep_dir)
    if not d.is_dir() or not (d / RESULTS_FILE).exists():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (expected a folder holding {RESULTS_FILE}, "
            "as written by `platform sweep`)"
        )
    loaded = load_inputs(d)
    return ModelInputs(
        configs=group_configs(loaded.rows),
        calibration=loaded.calibration,
        options=SyncOptions.from_spec(_read(d / SPEC_FILE, yaml_file=True)),
        calibration_raw=_dict(_read(d / CALIBRATION_FILE)),
        price=loaded.price_per_device_hour,
        name=loaded.name,
        notes=list(loaded.notes),
    )


def report_inputs(
    configs: list[Config],
    calibration: Calibration | None,
    price: float,
    sweep_dir: Path | None,
    name: str = "sweep",
) -> ModelInputs:
    """The model's inputs for an already-built report (options and calibration.json's extra
    keys read from its directory when it has one)."""
    options, raw = SyncOptions(), {}
    if sweep_dir is not None:
        options = SyncOptions.from_spec(_read(sweep_dir / SPEC_FILE, yaml_file=True))
        raw = _dict(_read(sweep_dir / CALIBRATION_FILE))
    return ModelInputs(configs, calibration, options, raw, price, name)


def _read(path: Path, yaml_file: bool = False) -> Any:
    """An optional file's content; None when absent or unreadable (load_inputs notes why)."""
    try:
        text = path.read_text()
        return yaml.safe_load(text) if yaml_file else json.loads(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


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
