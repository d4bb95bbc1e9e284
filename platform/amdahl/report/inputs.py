"""What a report reads from a sweep directory: results.parquet (required), and when present
calibration.json (from `platform calibrate`), spec.yaml (the price of a device-hour) and plan.json
(trials refused before launch). Every optional file degrades to "not known" with a note.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from amdahl.results import read_results
from amdahl.sweepdir import CALIBRATION_FILE, PLAN_FILE, SPEC_FILE

if TYPE_CHECKING:
    from amdahl.search import SearchState

#: The measured peak (calibration.json's `peak_flops` key) a precision's MFU is taken against:
#: its own number format's (amdahl.peak measures each the same way).
PEAK_KIND = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bf16_weights": "bf16", "fp16": "fp16"}
#: Last resort when neither calibration.json nor the rows have a precision's own peak: fp16 runs
#: on the same tensor cores as bf16. tf32 has none: against the IEEE fp32 peak its MFU reads
#: several hundred percent.
_STAND_IN = {"fp16": "bf16"}


@dataclass(frozen=True)
class Calibration:
    """The measured interconnect (alpha-beta) and, optionally, peak FLOP/s and model size."""

    alpha_s: float | None = None
    bandwidth_Bps: float | None = None
    devices: int | None = None
    backend: str = ""
    all_reduce: list[dict[str, Any]] = field(default_factory=list)
    peak_flops: dict[str, float] = field(default_factory=dict)
    peak_source: str = ""
    device_memory_bytes: float | None = None
    fit_rel_rmse: float | None = None
    grad_bytes: float | None = None
    grad_bytes_by_params: dict[str, float] = field(default_factory=dict)
    #: Per precision, the median `peak_flops` the trials measured themselves (results rows).
    row_peak_flops: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        def num(key: str, zero_ok: bool = False) -> float | None:
            v = d.get(key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            return float(v) if ok and (v > 0 or (zero_ok and v == 0)) else None

        peaks = d.get("peak_flops") or {}
        by_params = d.get("grad_bytes_by_params") or {}
        return cls(
            alpha_s=num("alpha_s", zero_ok=True),
            bandwidth_Bps=num("bandwidth_Bps"),
            devices=int(d["devices"]) if isinstance(d.get("devices"), int) else None,
            backend=str(d.get("backend") or ""),
            all_reduce=[m for m in d.get("all_reduce") or [] if isinstance(m, dict)],
            peak_flops={
                str(k): float(v)
                for k, v in (peaks.items() if isinstance(peaks, dict) else [])
                if isinstance(v, (int, float)) and v > 0
            },
            peak_source=str(d.get("peak_source") or ""),
            device_memory_bytes=num("device_memory_bytes"),
            fit_rel_rmse=num("fit_rel_rmse", zero_ok=True),
            grad_bytes=num("grad_bytes"),
            grad_bytes_by_params={
                str(k): float(v)
                for k, v in (by_params.items() if isinstance(by_params, dict) else [])
                if isinstance(v, (int, float)) and v > 0
            },
        )

    @property
    def has_comm_model(self) -> bool:
        return self.alpha_s is not None and self.bandwidth_Bps is not None

    def grad_bytes_for(self, params: str | None) -> float | None:
        """Gradient bytes of the configuration's model: by its params, else the single value."""
        if params is not None and params in self.grad_bytes_by_params:
            return self.grad_bytes_by_params[params]
        if self.grad_bytes is not None:
            return self.grad_bytes
        if len(self.grad_bytes_by_params) == 1:
            return next(iter(self.grad_bytes_by_params.values()))
        return None

    def peak_for(
        self, precision: str | None, row_peak: float | None = None
    ) -> tuple[float, str] | None:
        """(peak FLOP/s per device, which peak) for a precision: calibration.json's peak of the
        precision's own number format (tf32 -> tf32, bf16 and bf16_weights -> bf16, ...); else
        the trial's own measured peak (`row_peak`, else the rows' median by precision); else,
        for fp16 only, the bf16 peak. None when nothing fits: tf32 never falls back to fp32."""
        kind = PEAK_KIND.get(precision or "fp32", "fp32")
        if kind in self.peak_flops:
            return self.peak_flops[kind], kind
        own = row_peak if row_peak and row_peak > 0 else self.row_peak_flops.get(precision or "")
        if own:
            return own, f"{kind}, trial's own"
        stand_in = _STAND_IN.get(kind)
        if stand_in in self.peak_flops:
            return self.peak_flops[stand_in], stand_in
        return None

    def with_row_peaks(self, rows: list[dict[str, Any]]) -> Calibration:
        """A copy that knows the peaks the trials measured (their `peak_flops` column), per
        precision, as the fallback where calibration.json has no peak for it."""
        by_precision: dict[str, list[float]] = {}
        for r in rows:
            v, precision = r.get("peak_flops"), r.get("precision")
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if ok and v > 0 and precision and r.get("status") == "ok":
                by_precision.setdefault(str(precision), []).append(float(v))
        peaks = {k: statistics.median(vs) for k, vs in by_precision.items()}
        return replace(self, row_peak_flops=peaks)


@dataclass
class SweepInputs:
    sweep_dir: Path | None
    name: str
    rows: list[dict[str, Any]]
    calibration: Calibration | None = None
    price_per_device_hour: float = 0.0
    refused: list[tuple[str, str]] = field(default_factory=list)  # (label, reason)
    notes: list[str] = field(default_factory=list)
    #: search: halving: its rungs and skips replayed from every row (`rows` then holds each
    #: configuration's longest measurement only), and plan.json's trial labels.
    search: SearchState | None = None
    labels: dict[str, str] = field(default_factory=dict)


def load_inputs(sweep_dir: str | Path) -> SweepInputs:
    """Read everything a report uses; only a broken results.parquet is an error."""
    d = Path(sweep_dir)
    rows = read_results(d).to_pylist()
    inputs = SweepInputs(sweep_dir=d, name=d.resolve().name, rows=rows)
    calib = _read_json(d / CALIBRATION_FILE, inputs.notes)
    if isinstance(calib, dict):
        inputs.calibration = Calibration.from_dict(calib).with_row_peaks(rows)
    spec = _read_yaml(d / SPEC_FILE, inputs.notes)
    report = spec.get("report") if isinstance(spec, dict) else None
    if isinstance(report, dict):
        price = report.get("cost_per_device_hour")
        if isinstance(price, (int, float)) and math.isfinite(price) and price > 0:
            inputs.price_per_device_hour = float(price)
    plan = _read_json(d / PLAN_FILE, inputs.notes)
    trials = plan.get("trials") if isinstance(plan, dict) else None
    if plan is not None and not isinstance(trials, list):
        inputs.notes.append(f"{PLAN_FILE} ignored: no list of trials in it")
    for t in trials if isinstance(trials, list) else []:
        if isinstance(t, dict) and t.get("trial_id"):
            inputs.labels[str(t["trial_id"])] = str(t.get("label") or t["trial_id"])
        if isinstance(t, dict) and t.get("refused"):
            reason = t["refused"]  # a string as sweepdir.plan_summary writes it; else JSON
            if not isinstance(reason, str):
                reason = json.dumps(reason, default=str)
            inputs.refused.append((str(t.get("label") or t.get("trial_id")), reason))
    if any(r.get("rung") is not None for r in rows):
        _searched(inputs, spec)
    return inputs


def _searched(inputs: SweepInputs, spec: Any) -> None:
    """A halving search's rows: replay its decisions for the "Search" section, and keep each
    configuration's longest measurement for the rest of the report."""
    from pydantic import ValidationError

    from amdahl.search import final_rows, replay
    from amdahl.spec import SearchSpec, TrainSpec

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
