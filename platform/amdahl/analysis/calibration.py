"""calibration.json as a typed value: the measured interconnect (alpha-beta), peak FLOP/s per
precision, the model's gradient bytes and parameter shapes, with the fallbacks MFU uses when a
peak is missing. Every key is optional and an odd value reads as absent.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from amdahl.analysis.stats import is_number

#: The measured peak (calibration.json's `peak_flops` key) a precision's MFU is taken against:
#: its own number format's (amdahl.worker.peak measures each the same way).
PEAK_KIND = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bf16_weights": "bf16", "fp16": "fp16"}
#: Last resort when neither calibration.json nor the rows have a precision's own peak: fp16 runs
#: on the same tensor cores as bf16. tf32 has none: against the IEEE fp32 peak its MFU reads
#: several hundred percent.
_STAND_IN = {"fp16": "bf16"}


@dataclass(frozen=True)
class Calibration:
    """The measured interconnect (alpha-beta) and, optionally, peak FLOP/s and model size.

    `inter_node_alpha_s` and `inter_node_bandwidth_Bps` describe links across nodes: put in the
    file by hand, as `platform calibrate` measures within a node only. `param_shapes_by_params`
    (per `params` JSON, the shapes of the model's trainable parameters, written by `platform
    calibrate`) holds None for an entry that is not a list of shapes."""

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
    inter_node_alpha_s: float | None = None
    inter_node_bandwidth_Bps: float | None = None
    param_shapes_by_params: dict[str, list[list[int]] | None] = field(default_factory=dict)
    #: Per precision, the median `peak_flops` the trials measured themselves (results rows).
    row_peak_flops: dict[str, float] = field(default_factory=dict)
    #: alpha and B fitted at each device count measured (the group's and its subgroups'):
    #: devices -> (alpha_s, bandwidth_Bps). How the collective grows with the device count.
    by_devices: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: Where an earlier sweep measured it, when this sweep reused that measurement (the same
    #: cluster shape: driver/calibration_reuse.py): "<sweep dir>, measured <UTC time>".
    reused_from: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        def num(key: str, zero_ok: bool = False) -> float | None:
            v = d.get(key)
            return float(v) if is_number(v) and (v > 0 or (zero_ok and v == 0)) else None

        peaks = d.get("peak_flops") or {}
        by_params = d.get("grad_bytes_by_params") or {}
        shapes = d.get("param_shapes_by_params")
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
            inter_node_alpha_s=num("inter_node_alpha_s", zero_ok=True),
            inter_node_bandwidth_Bps=num("inter_node_bandwidth_Bps"),
            param_shapes_by_params={
                str(k): v if _is_shape_list(v) else None
                for k, v in (shapes.items() if isinstance(shapes, dict) else [])
            },
            by_devices=_by_devices(d.get("by_devices")),
            reused_from=_reused_from(d.get("reused_from")),
        )

    @property
    def has_comm_model(self) -> bool:
        return self.alpha_s is not None and self.bandwidth_Bps is not None

    @property
    def has_inter_node_model(self) -> bool:
        return self.inter_node_alpha_s is not None and self.inter_node_bandwidth_Bps is not None

    def grad_bytes_for(self, params: str | None) -> float | None:
        """Gradient bytes of the configuration's model: by its params, else the single value."""
        if params is not None and params in self.grad_bytes_by_params:
            return self.grad_bytes_by_params[params]
        if self.grad_bytes is not None:
            return self.grad_bytes
        if len(self.grad_bytes_by_params) == 1:
            return next(iter(self.grad_bytes_by_params.values()))
        return None

    def shapes_for(self, params: str | None) -> list[list[int]] | None:
        """Parameter shapes of the configuration's model: by its params, else the single entry;
        None when neither is a list of shapes."""
        shapes = self.param_shapes_by_params
        chosen = shapes.get(params) if params is not None else None
        if chosen is None and len(shapes) == 1:
            chosen = next(iter(shapes.values()))
        return chosen

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
            if is_number(v) and v > 0 and precision and r.get("status") == "ok":
                by_precision.setdefault(str(precision), []).append(float(v))
        peaks = {k: statistics.median(vs) for k, vs in by_precision.items()}
        return replace(self, row_peak_flops=peaks)


def _is_shape_list(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in v
    )


def _by_devices(raw: Any) -> dict[int, tuple[float, float]]:
    """calibration.json's `by_devices` ({"2": {"alpha_s", "bandwidth_Bps"}, ...}); an entry
    with an odd key or value is left out."""
    out: dict[int, tuple[float, float]] = {}
    for key, fit in raw.items() if isinstance(raw, dict) else []:
        try:
            q = int(key)
        except (TypeError, ValueError):
            continue
        if not isinstance(fit, dict) or q < 2:
            continue
        alpha, bandwidth = fit.get("alpha_s"), fit.get("bandwidth_Bps")
        if is_number(alpha) and alpha >= 0 and is_number(bandwidth) and bandwidth > 0:
            out[q] = (float(alpha), float(bandwidth))
    return out


def _reused_from(value: Any) -> str:
    """calibration.json's `reused_from` ({"sweep_dir", "measured_at"}) as one phrase."""
    if not isinstance(value, dict) or not value.get("sweep_dir"):
        return ""
    at = f", measured {value['measured_at']}" if value.get("measured_at") else ""
    return f"{value['sweep_dir']}{at}"
