"""The fitted step-time model put to use: its predictions of a sweep's families at device counts,
batch sizes and node counts the sweep did not measure (`platform predict`, the report's projected
curves), each with its interval and distance words from the model's checks of itself
(analysis/selfcheck.py).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.comm import Oversubscribed
from amdahl.analysis.configs import NO_SYNC, Config, config_options, scale_batch
from amdahl.analysis.cost import cost_per_million, device_hours_per_million
from amdahl.analysis.intervals import (
    Evidence,
    Interval,
    evidence_of,
    extrapolated_band,
)
from amdahl.analysis.memory_model import predict_peak
from amdahl.analysis.points import (
    FAMILY_SETTINGS,
    family_key,
    nodes_of,
)
from amdahl.analysis.selfcheck import (
    Extrapolation,
    LooPoint,
    beyond_measured,
    error_summary,
    extrapolation_checks,
    headline_check,
    leave_one_out,
)
from amdahl.analysis.stats import differs
from amdahl.analysis.stepmodel import (
    Family,
    ModelInputs,
    Prediction,
    StepModel,
    fit,
)

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
