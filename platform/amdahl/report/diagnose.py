"""Where each configuration's step time went: the breakdown, the bottleneck named by the rules
in bottleneck.py, the ring model's prediction and MFU; and what the runs say beside it (failed
and refused trials, the largest batch that fit, compiled against eager).

Each step is split into data wait, forward, backward, optimizer, exposed communication (phase
time with the sync strategy minus the same configuration with sync none) and time outside those
phases.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.alphabeta import ring_allreduce_s
from amdahl.analysis.calibration import Calibration
from amdahl.analysis.configs import NO_SYNC, SETTINGS, Config
from amdahl.analysis.memory_view import MemoryView
from amdahl.analysis.overlap import straggler_of
from amdahl.analysis.stats import Stat, differs, is_number
from amdahl.report.bottleneck import (
    ADVICE,
    BF16_TIP,
    COMPUTE,
    DATA,
    MEMORY,
    THRESHOLDS,
    StepFigures,
    advice_for,
    ms_text,
    step_findings,
    step_shares,
    trace_notes,
)
from amdahl.report.document import mib
from amdahl.strategies import ALL_PHASES, STRATEGIES

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

    @property
    def overlap(self) -> Stat | None:
        """Share of the traced communication overlapped by computation (profiler pass)."""
        return self.config.stat("comm_overlap")

    @property
    def comm_trace(self) -> Stat | None:
        """Communication seconds per step in the profiler traces."""
        return self.config.stat("comm_trace_s")

    @property
    def straggler(self) -> tuple[int, float] | None:
        """(rank, seconds per step the other ranks wait for it), from the traces."""
        return straggler_of(self.config.ok_rows)


def twin_key(config: Config, **changes: Any) -> tuple:
    """The key of `config`'s twin with `changes` to its settings (a Config's key)."""
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


def diagnose(
    configs: list[Config],
    calibration: Calibration | None = None,
    memory: MemoryView | None = None,
) -> list[Diagnosis]:
    """One diagnosis per ok configuration, in the order given. `memory`: the probe's facts and
    the device's size, for the memory finding and its advice (none: measured figures only)."""
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
        none = by_key.get(twin_key(c, sync=NO_SYNC))
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
        _name_bottleneck(d, configs, calibration, memory or MemoryView())
    return list(out.values())


def _attach_model(d: Diagnosis, calib: Calibration | None) -> None:
    """Ring all-reduce prediction and MFU, when the calibration makes them possible."""
    c = d.config
    grad = calib.grad_bytes_for(c.settings["params"]) if calib is not None else None
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
        groups.setdefault(twin_key(d.config, batch_size=None), []).append(d)
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


def _step_figures(d: Diagnosis, wall: float) -> StepFigures:
    seg = d.segments
    return StepFigures(
        wall=wall,
        cuda=d.config.device_type == "cuda",
        comm=seg["exposed comm"],
        comm_measured=d.comm is not None and d.comm_measurable,
        data=seg["data wait"],
        other=seg["other"],
        compute=_compute_s(d),
        fixed=d.fixed_s or 0.0,
        overlap=d.overlap.median if d.overlap else None,
        straggler=d.straggler,
    )


def _comm_note(d: Diagnosis) -> str | None:
    """What the diagnosis could not say about communication, and how to measure it."""
    c = d.config
    if c.sync != NO_SYNC and c.devices > 1 and d.comm is None:
        return "exposed communication unknown: add sync none to the grid to measure it"
    if d.comm is not None and not d.comm_measurable:
        return "exposed communication: no measurable difference from sync none"
    return None


def _name_bottleneck(
    d: Diagnosis, configs: list[Config], calib: Calibration | None, memory: MemoryView
) -> None:
    """Run bottleneck.BOTTLENECK_RULES over the step's figures and fill the diagnosis's verdict."""
    if not d.wall_s:
        d.evidence = "no step time recorded"
        return
    s = _step_figures(d, d.wall_s)
    findings = step_findings(s)
    d.shares = step_shares(s, findings)
    if findings:
        top = max(findings, key=lambda f: f.share)  # the first of equal shares
        d.bottleneck, d.evidence = top.category, top.evidence
        d.also = [f"{f.category}: {f.evidence}" for f in findings if f is not top]
    else:
        d.bottleneck = COMPUTE
        d.evidence = f"forward + backward + optimizer {ms_text(s.compute)} = {s.of_step(s.compute)}"
    finding = _memory_finding(d.config, configs, calib, memory)
    if finding:
        d.also.append(f"{MEMORY}: {finding}")
    note = _comm_note(d)
    if note:
        d.also.append(note)
    d.also += trace_notes(s)
    d.advice = [
        _bf16_checked(d.config, configs, calib) if a == BF16_TIP else a
        for a in advice_for(d.bottleneck, s, bool(finding))
    ]
    saved = memory.savings(d.config) if finding else []
    if saved:  # what the memory model predicts each change saves, before the generic tips
        d.advice = [memory_tip(saved), *(a for a in d.advice if a not in ADVICE[MEMORY])]
    # CPU only: on a GPU the same wait is named "data loading or host-device transfer"
    if d.bottleneck == DATA and _loader_with_workers(d.config):
        d.advice.insert(0, LOADER_IN_PROCESS_TIP)


#: For a CPU trial whose DataLoader worker keeps it waiting (docs/performance-history.md, "What
#: the loop costs beside a plain loop": on the 2-core box one worker process cost a quarter of
#: the one-device throughput, 0 workers were at 0.98 of plain).
LOADER_IN_PROCESS_TIP = (
    "input torch_loader on a host with few cores: try data_workers: 0 (the DataLoader makes "
    "each batch in the training process: no worker process competing for the cores, no copy "
    "between processes; its time then shows as data wait)"
)


def _loader_with_workers(c: Config) -> bool:
    """A torch_loader trial with worker processes (`input` absent in old rows: Ray Data)."""
    return c.settings.get("input") == "torch_loader" and (c.settings.get("data_workers") or 0) > 0


def _bf16_checked(c: Config, configs: list[Config], calib: Calibration | None) -> str:
    """The bf16 tip, unless this sweep's own figures contradict it (issue 53: the report advised
    bf16 "for faster matmuls" while its calibration measured bf16 at 81 GFLOP/s and fp32 at
    143): the configuration's bf16 twin measured no faster, or the device's measured bf16
    matmul peak at or below fp32's (calibration.json's, else the trials' own)."""
    if c.settings.get("precision") != "fp32":
        return BF16_TIP
    twin = next((o for o in configs if o.key == twin_key(c, precision="bf16") and o.ok), None)
    ours, theirs = c.throughput, twin.throughput if twin else None
    if ours and theirs and not (theirs.median > ours.median and differs(theirs, ours)):
        return (
            f"precision bf16: measured no faster here ({theirs.median:,.0f} vs "
            f"{ours.median:,.0f} samples/s at fp32)"
        )
    peaks = {p: _peak(p, configs, calib) for p in ("bf16", "fp32")}
    if peaks["bf16"] and peaks["fp32"] and peaks["bf16"] <= peaks["fp32"]:
        return (
            f"precision bf16: not for speed on this device: its measured bf16 matmul peak "
            f"({peaks['bf16'] / 1e9:,.0f} GFLOP/s) is not above fp32's "
            f"({peaks['fp32'] / 1e9:,.0f} GFLOP/s)"
        )
    return BF16_TIP


def _peak(precision: str, configs: list[Config], calib: Calibration | None) -> float | None:
    """The device's measured peak FLOP/s for a precision: calibration.json's own kind, else the
    median the sweep's trials of that precision measured."""
    if calib is not None and precision in calib.peak_flops:
        return calib.peak_flops[precision]
    own = [
        r["peak_flops"]
        for o in configs
        if o.settings.get("precision") == precision
        for r in o.ok_rows
        if is_number(r.get("peak_flops"))
    ]
    return statistics.median(own) if own else None


def _memory_finding(
    c: Config, configs: list[Config], calib: Calibration | None, memory: MemoryView
) -> str:
    peak = c.stat("peak_mem_bytes")
    cap = (calib.device_memory_bytes if calib else None) or memory.device_bytes
    if peak and cap and peak.median / cap >= THRESHOLDS["memory"]:
        return f"peak {peak.median / 2**20:,.0f} MiB = {peak.median / cap:.0%} of the device"
    bigger_oom = sorted(
        o.batch_size
        for o in configs
        if o.key == twin_key(c, batch_size=o.batch_size)
        and (o.batch_size or 0) > (c.batch_size or 0)
        and any(r.get("status") == "oom" for r in o.rows)
    )
    if bigger_oom:
        return f"batch {bigger_oom[0]} ran out of memory: batch size is memory-bound here"
    return ""


# ----------------------------------------------------------------- failures, batch limits, compile


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
        eager = by_key.get(twin_key(c, compile="eager"))
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


#: Counted and stated FLOPs per sample further apart than this (relative to the counted) get a
#: line in the report: one of the two describes other work than the step executes.
FLOPS_DISAGREE = 0.10


def flops_notes(configs: list[Config]) -> list[str]:
    """One line per model whose stated FLOPs per sample (the workload's `flops_per_sample`)
    and counted ones (FlopCounterMode, worker/flops.py) differ by more than FLOPS_DISAGREE,
    naming both and the one MFU used (`flops_source`)."""
    seen: dict[tuple[float, float], str] = {}
    for c in configs:
        for r in c.ok_rows:
            counted, stated = r.get("flops_counted"), r.get("flops_stated")
            if not (is_number(counted) and is_number(stated) and counted > 0):
                continue
            if abs(stated / counted - 1) > FLOPS_DISAGREE and (counted, stated) not in seen:
                used = "stated" if r.get("flops_source") == "stated" else "counted"
                seen[(counted, stated)] = (
                    f"FLOPs per sample ({c.label}): the workload states {stated:,.0f}, torch's "
                    f"FlopCounterMode counts {counted:,.0f} in one training step "
                    f"({stated / counted:.2f}x the count); MFU uses the {used} figure"
                    + (" (the workload's flops_override)" if used == "stated" else "")
                )
    return list(seen.values())


#: How many of the memory model's savings a memory-bound configuration's advice names.
SAVINGS_ADVISED = 3


def memory_tip(saved: list[tuple[str, float]]) -> str:
    """The memory model's largest savings per device, as one line of advice."""
    named = ", ".join(f"{name} {mib(b)} MiB less" for name, b in saved[:SAVINGS_ADVISED])
    return f"predicted per device at this batch (analysis/memory_model.py): {named}"
