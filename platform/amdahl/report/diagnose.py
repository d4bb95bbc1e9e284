"""Where the time went and what to change: bottlenecks, quality flags, the recommendation.

Each configuration's step is split into data wait, forward, backward, optimizer, exposed
communication and time outside those phases; the dominant bottleneck is named in the seed
table's vocabulary (Python/framework overhead, data loading, host-device transfer, kernel-launch
overhead, communication, memory) when its share passes the thresholds in `THRESHOLDS`, which the
report prints. Otherwise the step is compute-bound.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.compute import (
    NO_SYNC,
    SETTINGS,
    Config,
    Stat,
    cost_per_million,
    differs,
    pareto_front,
    ring_allreduce_s,
)
from amdahl.strategies import ALL_PHASES, STRATEGIES

COMMUNICATION = "communication"
DATA = "data loading"
TRANSFER = "host-device transfer"
OVERHEAD = "Python/framework overhead"
LAUNCH = "kernel-launch overhead"
MEMORY = "memory"
COMPUTE = "compute"

#: The thresholds the diagnosis uses (printed in every report).
THRESHOLDS: dict[str, float] = {
    "communication": 0.20,
    "data_wait": 0.05,
    "outside_phases": 0.15,
    "fixed_cost": 0.50,
    "memory": 0.90,
    "accuracy_points": 0.005,
    "loss_relative": 0.01,
}

THRESHOLD_TEXT = [
    f"{COMMUNICATION}: exposed communication (phase time with the sync strategy minus the same "
    f"configuration with sync none) >= {THRESHOLDS['communication']:.0%} of the step",
    f"{DATA} (on GPUs data wait is the device's idle gap between steps, so it also holds a "
    f"{TRANSFER} that did not finish under the previous step): data wait >= "
    f"{THRESHOLDS['data_wait']:.0%} of the step",
    f"{OVERHEAD}: time outside the timed phases (Python loop, stragglers) >= "
    f"{THRESHOLDS['outside_phases']:.0%} of the step, or on CPU a fixed per-step cost "
    f">= {THRESHOLDS['fixed_cost']:.0%} of the compute phases",
    f"{LAUNCH} (GPU): fixed per-step cost (intercept of compute time against batch size) "
    f">= {THRESHOLDS['fixed_cost']:.0%} of the compute phases",
    f"{MEMORY}: peak memory >= {THRESHOLDS['memory']:.0%} of the device's memory, or a larger "
    "batch of the same configuration ran out of memory",
    f"{COMPUTE}: none of the above; the model's own arithmetic dominates",
    "dominant = the flagged category with the largest share of the step",
    f"quality: val accuracy lower than the reference by more than max(spread, "
    f"{THRESHOLDS['accuracy_points'] * 100:.1f} points), or val loss higher by more than "
    f"max(spread, {THRESHOLDS['loss_relative']:.0%}), is flagged and never recommended",
]

#: What to try next, per bottleneck, in the sweep file's own terms.
ADVICE: dict[str, list[str]] = {
    COMMUNICATION: [
        "raise batch_size: more compute per all-reduce",
        "compress or thin the traffic: sync ddp_fp16, powersgd, or accumulate (fewer all-reduces)",
        "tune options.bucket_cap_mb so all-reduce overlaps backward",
        "if the speedup stays below 1, fewer devices train faster",
    ],
    DATA: [
        "raise data_workers and resources.cpus_per_data_worker",
        "raise options.prefetch_batches",
        "move preprocessing out of the step (store it once)",
    ],
    TRANSFER: [
        "a copy longer than a step cannot hide behind it: send fewer bytes per batch",
        "send compact dtypes (uint8, bf16) and convert on the device",
    ],
    OVERHEAD: [
        "raise batch_size: the fixed per-step cost is paid once per step",
        "compile: inductor or torchscript to cut per-op Python dispatch",
        "look for per-step Python work (logging, .item(), host syncs)",
    ],
    LAUNCH: [
        "raise batch_size: more work per kernel",
        "compile: inductor with options.compile_mode reduce-overhead (CUDA graphs)",
        "fuse small ops (compile) and avoid host syncs in the step",
    ],
    MEMORY: [
        "precision: bf16 or bf16_weights to halve activations/weights",
        "sync: accumulate (smaller micro-batches, same global batch)",
        "sync: zero1 or fsdp to shard optimizer state and parameters",
    ],
    COMPUTE: [
        "precision: bf16 (autocast) for faster matmuls",
        "compile: inductor, and keep it only if it measures faster",
        "this is the healthy case: add devices while efficiency holds",
    ],
}

SEGMENTS = ("data wait", "forward", "backward", "optimizer", "exposed comm", "other")


# --------------------------------------------------------------------------- breakdown


@dataclass
class Diagnosis:
    config: Config
    wall_s: float | None = None
    segments: dict[str, float] = field(default_factory=dict)
    comm: Stat | None = None  # exposed communication per step
    comm_measurable: bool = False
    fixed_s: float | None = None
    shares: dict[str, float] = field(default_factory=dict)
    bottleneck: str = COMPUTE
    evidence: str = ""
    also: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    predicted_comm_s: float | None = None
    grad_bytes: float | None = None
    mfu: float | None = None
    mfu_peak: str = ""


def _without(config: Config, **changes: Any) -> tuple:
    s = {**config.settings, **changes}
    return tuple(s[c] for c in (*SETTINGS, "devices"))


def _comm_phases(sync: str) -> tuple[str, ...]:
    """The timed phases that hold `sync`'s communication (strategies.py's table); a strategy the
    table does not know (a results file from another version) may put it anywhere."""
    strategy = STRATEGIES.get(sync)
    return strategy.comm_phases if strategy is not None else ALL_PHASES


def _wire_factor(sync: str) -> float | None:
    """Bytes on the wire per gradient byte when the ring model describes `sync`, else None."""
    strategy = STRATEGIES.get(sync)
    return strategy.wire_factor if strategy is not None else None


def _exposed_comm(c: Config, none: Config) -> tuple[Stat, bool, dict[str, float]]:
    """Exposed communication = phase time with the strategy - same phases with sync none."""
    phases = _comm_phases(c.sync)
    med = lo = hi = margin = 0.0
    per_phase: dict[str, float] = {}
    for ph in phases:
        a, b = c.stat(ph), none.stat(ph)
        if a is None or b is None:
            continue
        per_phase[ph] = max(0.0, a.median - b.median)
        med += a.median - b.median
        lo += a.lo - b.hi
        hi += a.hi - b.lo
        margin += max(a.spread, b.spread)
    stat = Stat(med, lo, hi, min(c.stat("throughput").n, none.stat("throughput").n))
    return stat, med > margin, per_phase


def diagnose(configs: list[Config], calibration: Calibration | None = None) -> list[Diagnosis]:
    """One diagnosis per ok configuration, in the order given."""
    by_key = {c.key: c for c in configs}
    out: dict[tuple, Diagnosis] = {}
    for c in configs:
        if not c.ok:
            continue
        d = Diagnosis(config=c)
        wall = c.step_wall
        d.wall_s = wall.median if wall else None
        phase = {ph: (c.stat(ph).median if c.stat(ph) else None) for ph in ALL_PHASES}
        per_phase: dict[str, float] = {}
        none = by_key.get(_without(c, sync=NO_SYNC))
        if c.sync != NO_SYNC and c.devices > 1 and none is not None and none.ok:
            d.comm, d.comm_measurable, per_phase = _exposed_comm(c, none)
        data = c.stat("data_wait_s")
        seg = {"data wait": data.median if data else 0.0}
        for ph, name in zip(ALL_PHASES, ("forward", "backward", "optimizer"), strict=True):
            seg[name] = max(0.0, (phase[ph] or 0.0) - per_phase.get(ph, 0.0))
        seg["exposed comm"] = sum(per_phase.values())
        timed = sum(seg.values())
        seg["other"] = max(0.0, d.wall_s - timed) if d.wall_s else 0.0
        d.segments = seg
        _attach_model(d, calibration)
        out[c.key] = d
    _fixed_costs(out)
    for d in out.values():
        _name_bottleneck(d, configs, calibration)
    return list(out.values())


def _attach_model(d: Diagnosis, calib: Calibration | None) -> None:
    """Ring all-reduce prediction and MFU, when the calibration makes them possible."""
    c = d.config
    grad = _row_value(c, "grad_bytes")
    if calib is not None:
        grad = grad or calib.grad_bytes_for(c.settings["params"])
    d.grad_bytes = grad
    wire = _wire_factor(c.sync)
    if calib is not None and calib.has_comm_model and grad and c.devices > 1 and wire is not None:
        d.predicted_comm_s = ring_allreduce_s(
            c.devices, grad * wire, calib.alpha_s, calib.bandwidth_Bps
        )
    flops = c.stat("achieved_flops")
    # Each trial's own peak first: measured by the same probe as calibrate's, on the trial's own
    # workers and in its own number format (tf32 included); calibration.json's is the fallback.
    own = c.stat("peak_flops")
    if own and own.median > 0:
        peak: tuple[float, str] | None = (own.median, f"{c.settings['precision']}, trial's own")
    else:
        peak = calib.peak_for(c.settings["precision"]) if calib else None
    if flops and peak:
        d.mfu = flops.median / (c.devices * peak[0])
        d.mfu_peak = peak[1]


def _row_value(c: Config, column: str) -> float | None:
    values = [r.get(column) for r in c.ok_rows if isinstance(r.get(column), (int, float))]
    return float(values[0]) if values else None


def _compute_s(d: Diagnosis) -> float:
    return sum(d.segments.get(k, 0.0) for k in ("forward", "backward", "optimizer"))


def _fixed_costs(diags: dict[tuple, Diagnosis]) -> None:
    """Fixed per-step cost: intercept of compute time against per-device batch size, fitted over
    configurations that differ only in batch size (least squares on medians)."""
    groups: dict[tuple, list[Diagnosis]] = {}
    for d in diags.values():
        unknown_comm = d.config.sync != NO_SYNC and d.config.devices > 1 and d.comm is None
        if unknown_comm or d.config.batch_size is None or _compute_s(d) <= 0:
            continue
        groups.setdefault(_without(d.config, batch_size=None), []).append(d)
    for members in groups.values():
        xs = [float(d.config.batch_size) for d in members]
        if len(set(xs)) < 2:
            continue
        ys = [_compute_s(d) for d in members]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        intercept = my - slope * mx if slope > 0 else max(ys)
        for d, y in zip(members, ys, strict=True):
            d.fixed_s = min(max(intercept, 0.0), y)


@dataclass(frozen=True)
class Finding:
    """A bottleneck category that passed its threshold: its share of the step and the evidence."""

    category: str
    share: float
    evidence: str


@dataclass(frozen=True)
class StepFigures:
    """What the bottleneck rules read about one configuration's step (seconds per step)."""

    wall: float
    cuda: bool
    comm: float  # exposed communication
    comm_measured: bool  # measured against a sync-none twin and above its spread
    data: float  # data wait
    other: float  # outside the timed phases
    compute: float  # forward + backward + optimizer
    fixed: float  # fixed per-step cost from the batch-size sweep (0 when unknown)

    @classmethod
    def of(cls, d: Diagnosis, wall: float) -> StepFigures:
        seg = d.segments
        return cls(
            wall=wall,
            cuda=d.config.device_type == "cuda",
            comm=seg["exposed comm"],
            comm_measured=d.comm is not None and d.comm_measurable,
            data=seg["data wait"],
            other=seg["other"],
            compute=_compute_s(d),
            fixed=d.fixed_s or 0.0,
        )

    @property
    def fixed_hit(self) -> bool:
        """Whether the fixed per-step cost passes its threshold (share of the compute phases)."""
        return self.compute > 0 and self.fixed / self.compute >= THRESHOLDS["fixed_cost"]

    @property
    def overhead(self) -> float:
        """Python/framework overhead: time outside the phases, plus on CPU a fixed cost that
        passes its threshold (on a GPU that cost is kernel-launch overhead)."""
        return self.other + (self.fixed if not self.cuda and self.fixed_hit else 0.0)

    @property
    def data_name(self) -> str:
        """On a GPU the device's idle gap also holds a late host-to-device copy."""
        return f"{DATA} or {TRANSFER}" if self.cuda else DATA

    def of_step(self, seconds: float) -> str:
        return f"{seconds / self.wall:.0%} of the {_ms(self.wall)} step"

    def fixed_text(self) -> str:
        return (
            f"a fixed per-step cost of {_ms(self.fixed)} ({self.fixed / self.compute:.0%} of "
            "compute, from the batch-size sweep)"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _communication_rule(s: StepFigures) -> Finding | None:
    if not (s.comm_measured and s.comm / s.wall >= THRESHOLDS["communication"]):
        return None
    return Finding(
        COMMUNICATION, s.comm / s.wall, f"exposed communication {_ms(s.comm)} = {s.of_step(s.comm)}"
    )


def _data_rule(s: StepFigures) -> Finding | None:
    if not (s.data / s.wall >= THRESHOLDS["data_wait"]):
        return None
    return Finding(s.data_name, s.data / s.wall, f"data wait {_ms(s.data)} = {s.of_step(s.data)}")


def _overhead_rule(s: StepFigures) -> Finding | None:
    cpu_fixed = s.fixed_hit and not s.cuda
    if not (s.other / s.wall >= THRESHOLDS["outside_phases"] or cpu_fixed):
        return None
    parts = [f"{_ms(s.other)} outside the timed phases"] if s.other else []
    if cpu_fixed:
        parts.append(s.fixed_text())
    evidence = " and ".join(parts) + f" = {s.of_step(s.overhead)}"
    return Finding(OVERHEAD, s.overhead / s.wall, evidence)


def _launch_rule(s: StepFigures) -> Finding | None:
    if not (s.cuda and s.fixed_hit):
        return None
    return Finding(LAUNCH, s.fixed / s.wall, s.fixed_text())


#: The bottleneck rules, in THRESHOLD_TEXT's order. Every rule that fires is a finding; the one
#: with the largest share of the step is the bottleneck (on a tie, the earlier rule), the others
#: are named beside it. None firing: compute-bound.
BOTTLENECK_RULES = (_communication_rule, _data_rule, _overhead_rule, _launch_rule)


def _shares(s: StepFigures, findings: list[Finding]) -> dict[str, float]:
    """Each category's share of the step (kernel-launch overhead only when it is a finding)."""
    shares = {COMMUNICATION: s.comm / s.wall, s.data_name: s.data / s.wall}
    shares[OVERHEAD] = s.overhead / s.wall
    shares.update({f.category: f.share for f in findings})
    shares[COMPUTE] = s.compute / s.wall
    return shares


def _comm_note(d: Diagnosis) -> str | None:
    """What the diagnosis could not say about communication, and how to measure it."""
    c = d.config
    if c.sync != NO_SYNC and c.devices > 1 and d.comm is None:
        return "exposed communication unknown: add sync none to the grid to measure it"
    if d.comm is not None and not d.comm_measurable:
        return "exposed communication: no measurable difference from sync none"
    return None


def _advice(bottleneck: str, s: StepFigures, memory_bound: bool) -> list[str]:
    """What to try, from ADVICE: on a GPU an idle gap may be input or copy, so both lists'
    first tips; a compute-bound step near its memory limit also gets the memory tip."""
    if bottleneck == s.data_name and s.cuda:
        return ADVICE[DATA][:2] + ADVICE[TRANSFER][:1]
    if memory_bound and bottleneck == COMPUTE:
        return ADVICE[COMPUTE] + ADVICE[MEMORY][:1]
    return list(ADVICE[bottleneck])  # a copy: the table is shared by every diagnosis


def _name_bottleneck(d: Diagnosis, configs: list[Config], calib: Calibration | None) -> None:
    """Run BOTTLENECK_RULES over the step's figures and fill the diagnosis's verdict."""
    if not d.wall_s:
        d.evidence = "no step time recorded"
        return
    s = StepFigures.of(d, d.wall_s)
    findings = [f for rule in BOTTLENECK_RULES if (f := rule(s)) is not None]
    d.shares = _shares(s, findings)
    if findings:
        top = max(findings, key=lambda f: f.share)  # the first of equal shares
        d.bottleneck, d.evidence = top.category, top.evidence
        d.also = [f"{f.category}: {f.evidence}" for f in findings if f is not top]
    else:
        d.bottleneck = COMPUTE
        d.evidence = f"forward + backward + optimizer {_ms(s.compute)} = {s.of_step(s.compute)}"
    memory = _memory_finding(d.config, configs, calib)
    if memory:
        d.also.append(f"{MEMORY}: {memory}")
    note = _comm_note(d)
    if note:
        d.also.append(note)
    d.advice = _advice(d.bottleneck, s, bool(memory))


def _memory_finding(c: Config, configs: list[Config], calib: Calibration | None) -> str:
    peak = c.stat("peak_mem_bytes")
    cap = calib.device_memory_bytes if calib else None
    if peak and cap and peak.median / cap >= THRESHOLDS["memory"]:
        return f"peak {peak.median / 2**20:,.0f} MiB = {peak.median / cap:.0%} of the device"
    bigger_oom = sorted(
        o.batch_size
        for o in configs
        if o.key == _without(c, batch_size=o.batch_size)
        and (o.batch_size or 0) > (c.batch_size or 0)
        and any(r.get("status") == "oom" for r in o.rows)
    )
    if bigger_oom:
        return f"batch {bigger_oom[0]} ran out of memory: batch size is memory-bound here"
    return ""


# --------------------------------------------------------------------------- quality


@dataclass
class QualityCheck:
    config: Config
    reference: Config | None
    worse: bool
    text: str


def _reference(c: Config, by_key: dict[tuple, Config]) -> Config | None:
    """The plain twin: same shape (devices, batch, data workers), fp32, eager, and ddp
    (p > 1) or sync none / ddp (p = 1)."""
    syncs = ["ddp"] if c.devices > 1 else [NO_SYNC, "ddp"]
    for s in syncs:
        ref = by_key.get(_without(c, precision="fp32", compile="eager", sync=s))
        if ref is not None and ref.ok:
            return ref
    return None


def check_quality(configs: list[Config]) -> dict[tuple, QualityCheck]:
    """Validation quality against each configuration's plain reference."""
    by_key = {c.key: c for c in configs}
    out = {}
    for c in configs:
        if not c.ok:
            continue
        ref = _reference(c, by_key)
        if c.sync == NO_SYNC and c.devices > 1:
            continue  # the ceiling measurement, never a candidate
        if ref is None or ref is c:
            out[c.key] = QualityCheck(c, ref, False, "reference" if ref is c else "no reference")
            continue
        acc, ref_acc = c.stat("val_accuracy"), ref.stat("val_accuracy")
        loss, ref_loss = c.stat("val_loss"), ref.stat("val_loss")
        if acc and ref_acc:
            margin = max(ref_acc.spread, acc.spread, THRESHOLDS["accuracy_points"])
            worse = acc.median < ref_acc.median - margin
            text = f"val accuracy {acc.median:.4f} vs {ref_acc.median:.4f} ({ref.label}); " + (
                "worse beyond the spread" if worse else "no measurable loss of quality"
            )
        elif loss and ref_loss:
            margin = max(
                ref_loss.spread, loss.spread, THRESHOLDS["loss_relative"] * ref_loss.median
            )
            worse = loss.median > ref_loss.median + margin
            text = f"val loss {loss.median:.4f} vs {ref_loss.median:.4f} ({ref.label}); " + (
                "worse beyond the spread" if worse else "no measurable loss of quality"
            )
        else:
            worse, text = False, "no validation metric recorded"
        out[c.key] = QualityCheck(c, ref, worse, text)
    return out


# --------------------------------------------------------------------------- recommendation


@dataclass
class Pick:
    goal: str
    config: Config
    value: Stat
    unit: str
    ties: list[Config] = field(default_factory=list)


@dataclass
class Recommendation:
    picks: list[Pick] = field(default_factory=list)
    pareto: list[Config] = field(default_factory=list)
    pareto_points: list[tuple[Config, float, float]] = field(default_factory=list)
    cost_label: str = ""
    excluded: list[tuple[Config, str]] = field(default_factory=list)
    eligible: list[Config] = field(default_factory=list)
    price: float = 0.0

    def headline(self) -> str:
        """One sentence: the fastest configuration, and whether more devices paid off."""
        if not self.picks:
            return ""
        best = self.picks[0]
        text = f"Fastest: {best.config.label} at {best.value.median:,.0f} samples/s."
        single = [c for c in self.eligible if c.devices == 1]
        multi = [c for c in self.eligible if c.devices > 1]
        if not single or not multi:
            return text
        top1 = max(single, key=lambda c: c.throughput.median)
        topn = max(multi, key=lambda c: c.throughput.median)
        r = topn.throughput.median / top1.throughput.median
        if not differs(topn.throughput, top1.throughput):
            return text + (
                f" More devices made no measurable difference: {topn.label} vs {top1.label}."
            )
        if r < 1:
            return text + (
                f" More devices did not pay off: the best multi-device configuration, "
                f"{topn.label}, reaches {r:.2f}x the best single-device one."
            )
        return text + (
            f" {topn.devices} devices ({topn.label}) give {r:.2f}x the best single device "
            f"({top1.label})."
        )


def cost_stat(c: Config, price: float) -> Stat | None:
    """Cost per million samples ($ at `price` per device-hour, or device-hours when 0)."""
    x = c.throughput
    if x is None or x.lo <= 0:
        return None
    unit = price if price > 0 else 1.0
    return x.inverse().scale(cost_per_million(c.devices, 1.0, unit))


def recommend(
    configs: list[Config], quality: dict[tuple, QualityCheck], price: float = 0.0
) -> Recommendation:
    rec = Recommendation(price=price)
    eligible = []
    for c in configs:
        if not c.ok:
            continue
        if c.sync == NO_SYNC and c.devices > 1:
            rec.excluded.append(
                (
                    c,
                    "sync none with p > 1 is the no-communication ceiling (each worker trains "
                    "its own model), a measurement, not a way to train",
                )
            )
        elif quality.get(c.key) and quality[c.key].worse:
            rec.excluded.append((c, quality[c.key].text))
        else:
            eligible.append(c)
    rec.eligible = eligible
    if not eligible:
        return rec
    goals: list[tuple[str, str, Any, bool]] = [
        ("throughput", "samples/s", lambda c: c.throughput, True),
        (
            "throughput per device",
            "samples/s/device",
            lambda c: c.throughput.scale(1 / c.devices),
            True,
        ),
    ]
    if price > 0:
        goals.append(("cost per million samples", "$", lambda c: cost_stat(c, price), False))
    for goal, unit, value, higher in goals:
        scored = [(c, value(c)) for c in eligible if value(c) is not None]
        if not scored:
            continue
        best, best_v = (max if higher else min)(scored, key=lambda cv: cv[1].median)
        ties = [c for c, v in scored if c is not best and not differs(v, best_v)]
        rec.picks.append(Pick(goal, best, best_v, unit, ties))
    rec.cost_label = (
        "cost per million samples ($)" if price > 0 else "device-hours per million samples"
    )
    pts = []
    for c in eligible:
        cost = cost_stat(c, price)
        if cost is not None:
            pts.append((c, c.throughput.median, cost.median))
    rec.pareto_points = pts
    rec.pareto = [pts[i][0] for i in pareto_front([(x, k) for _, x, k in pts])]
    return rec


# --------------------------------------------------------------------------- failures, limits


@dataclass
class Failure:
    label: str
    status: str
    reason: str
    count: int = 1


def failures(configs: list[Config], refused: list[tuple[str, str]] = ()) -> list[Failure]:
    """Every row that is not ok, with its reason's first line, and trials refused by the plan."""
    out: dict[tuple[str, str, str], Failure] = {}
    for c in configs:
        for r in c.rows:
            if r.get("status") == "ok":
                continue
            status = r.get("status") or "unknown"
            reason = (r.get("error") or "").strip().splitlines()
            key = (c.label, status, reason[0] if reason else "no reason recorded")
            if key in out:
                out[key].count += 1
            else:
                out[key] = Failure(*key)
    for label, reason in refused:
        out.setdefault((label, "refused", reason), Failure(label, "refused", reason))
    return list(out.values())


@dataclass
class BatchLimit:
    precision: str
    sync: str
    largest_ok: int | None
    smallest_oom: int | None

    @property
    def text(self) -> str:
        where = f"{self.precision} {self.sync}"
        if self.largest_ok is None:
            return (
                f"{where}: nothing fit; the smallest batch tried "
                f"({self.smallest_oom}/device) ran out of memory"
            )
        if self.smallest_oom is None:
            return (
                f"{where}: largest batch tried {self.largest_ok}/device, no out-of-memory: "
                "the limit is higher"
            )
        return (
            f"{where}: largest batch that fit {self.largest_ok}/device; "
            f"{self.smallest_oom}/device ran out of memory"
        )


def batch_limits(configs: list[Config]) -> list[BatchLimit]:
    """The largest per-device batch that fit, per precision and sync."""
    groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    for c in configs:
        if c.batch_size is None:
            continue
        ok, oom = groups.setdefault((str(c.settings["precision"]), c.sync), ([], []))
        if c.ok:
            ok.append(c.batch_size)
        if any(r.get("status") == "oom" for r in c.rows):
            oom.append(c.batch_size)
    out = []
    for (precision, sync), (ok, oom) in sorted(groups.items()):
        if not ok and not oom:
            continue
        largest = max(ok) if ok else None
        above = [b for b in oom if largest is None or b > largest]
        out.append(BatchLimit(precision, sync, largest, min(above) if above else None))
    return out


def compile_findings(configs: list[Config]) -> list[str]:
    """Compiled vs eager twin: the speedup (or not), the one-time cost, the break-even point."""
    by_key = {c.key: c for c in configs}
    out = []
    for c in configs:
        if not c.ok or c.settings["compile"] in (None, "eager"):
            continue
        eager = by_key.get(_without(c, compile="eager"))
        comp_s = c.stat("compile_s")
        cost = f"one-time compile cost {comp_s.median:.1f} s" if comp_s else "compile cost unknown"
        if eager is None or not eager.ok:
            out.append(f"{c.label}: {cost}; no eager twin to compare with")
            continue
        r = c.throughput.median / eager.throughput.median
        if not differs(c.throughput, eager.throughput):
            verdict = "no measurable difference from eager"
        elif r > 1:
            t_c, t_e = c.step_wall, eager.step_wall
            saved = (t_e.median - t_c.median) if t_c and t_e else 0.0
            even = (
                f", pays for itself after {comp_s.median / saved:,.0f} steps"
                if comp_s and saved > 0
                else ""
            )
            verdict = f"{r:.2f}x eager{even}"
        else:
            verdict = f"{r:.2f}x eager: slower, keep eager"
        out.append(f"{c.label}: {verdict}; {cost}")
    return out
