"""What a report and the step-time model read from a sweep directory: results.parquet
(required), and when present calibration.json (from `platform calibrate`), spec.yaml (the price
of a device-hour, the sync options, a halving search's settings) and plan.json (trial labels,
trials refused before launch). Every optional file degrades to "not known" with a note; this is
the one place that reads them.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import options_from_mapping
from amdahl.analysis.memory_model import MemoryFacts
from amdahl.analysis.memory_view import MemoryView
from amdahl.spec.schema import OptionsSpec
from amdahl.sweepdir.layout import CALIBRATION_FILE, PLAN_FILE, SPEC_FILE
from amdahl.sweepdir.table import read_results

if TYPE_CHECKING:
    from amdahl.search.halving import SearchState


@dataclass
class SweepInputs:
    sweep_dir: Path | None
    name: str
    rows: list[dict[str, Any]]
    calibration: Calibration | None = None
    #: spec.yaml's options, as the step-time model reads them (defaults where absent or odd).
    options: OptionsSpec = field(default_factory=OptionsSpec)
    price_per_device_hour: float = 0.0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (label, reason)
    notes: list[str] = field(default_factory=list)
    #: search: halving: its rungs and skips replayed from every row (`rows` then holds each
    #: configuration's longest measurement only), and plan.json's trial labels.
    search: SearchState | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: spec.yaml as read (None when absent or unreadable), and plan.json's `resources` (what
    #: `resources: auto` chose): what report/best.py turns into best.yaml.
    spec: dict[str, Any] | None = None
    planned_resources: dict[str, Any] | None = None
    #: plan.json's memory facts by (workload parameters as JSON, precision).
    memory_facts: dict[tuple[str, str], MemoryFacts] = field(default_factory=dict)
    #: The device memory (GB) plan.json held trials to; None where unknown.
    device_memory_gb: float | None = None

    @property
    def memory(self) -> MemoryView:
        """The probe's facts, the device's size (calibration.json's measured, else the
        plan's) and the overhead the rows show, for the report's memory figures."""
        measured = self.calibration.device_memory_bytes if self.calibration else None
        planned = self.device_memory_gb * 1e9 if self.device_memory_gb else None
        return MemoryView.of(self.memory_facts, self.rows, measured or planned)


def load_inputs(sweep_dir: str | Path) -> SweepInputs:
    """Read everything a report uses; only a broken results.parquet is an error."""
    d = Path(sweep_dir)
    rows = read_results(d).to_pylist()
    inputs = SweepInputs(sweep_dir=d, name=d.resolve().name, rows=rows)
    calib = _read_json(d / CALIBRATION_FILE, inputs.notes)
    if isinstance(calib, dict):
        inputs.calibration = Calibration.from_dict(calib).with_row_peaks(rows)
    spec = _read_yaml(d / SPEC_FILE, inputs.notes)
    inputs.spec = spec if isinstance(spec, dict) else None
    inputs.options = options_from_mapping(spec)
    inputs.price_per_device_hour = _price(spec)
    _read_plan(_read_json(d / PLAN_FILE, inputs.notes), inputs)
    if any(r.get("rung") is not None for r in rows):
        _searched(inputs, spec)
    return inputs


def _price(spec: Any) -> float:
    """spec.yaml's report.cost_per_device_hour; 0 (unknown) when absent or not a positive
    number."""
    report = spec.get("report") if isinstance(spec, dict) else None
    if isinstance(report, dict):
        price = report.get("cost_per_device_hour")
        if isinstance(price, (int, float)) and math.isfinite(price) and price > 0:
            return float(price)
    return 0.0


def _read_plan(plan: Any, inputs: SweepInputs) -> None:
    """plan.json's trial labels and the trials it refused, onto `inputs`."""
    trials = plan.get("trials") if isinstance(plan, dict) else None
    resources = plan.get("resources") if isinstance(plan, dict) else None
    _read_memory_facts(plan, inputs)
    gb = plan.get("device_memory_gb") if isinstance(plan, dict) else None
    inputs.device_memory_gb = float(gb) if isinstance(gb, (int, float)) and gb > 0 else None
    inputs.planned_resources = resources if isinstance(resources, dict) else None
    if plan is not None and not isinstance(trials, list):
        inputs.notes.append(f"{PLAN_FILE} ignored: no list of trials in it")
    for t in trials if isinstance(trials, list) else []:
        if isinstance(t, dict) and t.get("trial_id"):
            inputs.labels[str(t["trial_id"])] = str(t.get("label") or t["trial_id"])
        if isinstance(t, dict) and t.get("refused"):
            # A string as plan_summary (sweepdir/driver_files.py) writes it; else shown as JSON.
            reason = t["refused"]
            if not isinstance(reason, str):
                reason = json.dumps(reason, default=str)
            inputs.refused.append((str(t.get("label") or t.get("trial_id")), reason))


def _read_memory_facts(plan: Any, inputs: SweepInputs) -> None:
    """plan.json's memory probe facts (a plan written before them has none)."""
    entries = plan.get("memory_facts") if isinstance(plan, dict) else None
    for e in entries if isinstance(entries, list) else []:
        try:
            key = (json.dumps(e["params"], sort_keys=True), str(e["precision"]))
            inputs.memory_facts[key] = MemoryFacts.from_dict(e["facts"])
        except (KeyError, TypeError, ValueError):
            inputs.notes.append(f"{PLAN_FILE}: a memory_facts entry unreadable, left out")


def _searched(inputs: SweepInputs, spec: Any) -> None:
    """A halving search's rows: replay its decisions for the "Search" section, and keep each
    configuration's longest measurement for the rest of the report."""
    from pydantic import ValidationError

    from amdahl.search.halving import final_rows, replay
    from amdahl.spec.schema import TrainSpec
    from amdahl.spec.search_section import SearchSpec

    raw = spec if isinstance(spec, dict) else {}
    try:
        search = SearchSpec(**(raw.get("search") or {}))
        train = TrainSpec(**(raw.get("train") or {}))
    except (ValidationError, TypeError) as e:
        inputs.notes.append(f"search section left out: {SPEC_FILE} does not validate ({e})")
    else:
        inputs.search = replay(inputs.rows, search, train)
    inputs.rows = final_rows(inputs.rows)
    inputs.notes.append(
        "search: halving: each configuration is shown with its longest measurement (the last "
        "rung it reached); the Search section says what was dropped where, and why"
    )


def _read_json(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deeply
        notes.append(f"{path.name} ignored: not readable JSON ({e})")
        return None


def _read_yaml(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: 2024-13-01
        notes.append(f"{path.name} ignored: not readable YAML ({e})")
        return None
