"""A configuration family of the step-time model (analysis/stepmodel.py) and its compute
term: the fitted lines per device count, the wrapper, kappa and the host contention a family
holds, the data wait it measured, and how a strategy borrows its `sync: none` sibling's compute.
Apart from stepmodel.py, which combines these with the communication and overlap terms.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from amdahl import strategies
from amdahl.analysis.comm import communicates
from amdahl.analysis.computefit import (
    BoundHit,
    Line,
    Lines,
    fit_line,
    fit_lines,
    fit_wrapper,
    nearest_devices,
    on_bound,
)
from amdahl.analysis.configs import Config, config_options, option_values
from amdahl.analysis.contention import Contention, HostShare, fit_contention
from amdahl.analysis.points import Point, family_key
from amdahl.analysis.stats import minimize_scalar
from amdahl.columns import AXIS_TABLE
from amdahl.spec.schema import OptionsSpec

KAPPA_RANGE = (0.25, 4.0)
#: Strategies that never communicate (`none`, the ceiling), from the strategy table.
SILENT = frozenset(n for n, s in strategies.STRATEGIES.items() if not s.communicates)


def recorded_options(configs: list[Config]) -> set[str]:
    """The options some configuration's `options` column names: the rows record those, so a
    configuration whose column leaves one out ran it at its default."""
    return {k for c in configs for k in option_values(c.settings)}


def family_options(settings: dict[str, Any], spec: OptionsSpec, recorded: set[str]) -> OptionsSpec:
    """The options a family's trials ran with: the spec's, with each option the family reads
    taken from its `options` column where the rows record that option (`recorded_options`).
    Rows that record none (written before the column, or every trial at the spec's values)
    ran the spec's. Built without validation, as comm.options_from_mapping: the model only
    reads numbers from it."""
    own = {k: v for k, v in config_options(settings).items() if k in recorded}
    return OptionsSpec.model_construct(**{**spec.model_dump(), **own})


@dataclass
class Family:
    """One configuration family's fitted terms."""

    key: tuple
    label: str
    settings: dict[str, Any]
    a_c: float | None = None  # seconds per step at batch 0
    b_c: float | None = None  # seconds per sample per device
    kappa: float = 1.0
    kappa_source: str = "default 1: no compute measured both on 1 and on more devices"
    compute_points: int = 0
    compute_source: str = ""
    gamma: float = 1.0
    gamma_source: str = "default 1: nothing to fit"
    theta: float = 1.0  # the strategy's communication cost against the calibrated collective
    grad_bytes: float | None = None
    shapes: list[list[int]] | None = None
    micro: float = 1.0
    data_wait: dict[float, float] = field(default_factory=dict)  # per-device batch -> s
    data_wait_all: float | None = None
    notes: list[str] = field(default_factory=list)
    #: Compute lines measured at p > 1 devices: p -> (a_p, b_p); the 1-device one is (a_c, b_c).
    lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    wrapper_s: float = 0.0  # omega: the strategy's wrapper per step, apart from compute
    wrapper_source: str = "none: the compute term holds whatever the trials ran"
    #: Parameters on a bound of their range (failed fits), this family's and those it borrowed.
    hits: list[BoundHit] = field(default_factory=list)
    #: Host contention between a node's ranks (analysis/contention.py), where the rows say
    #: each rank's CPU share and the node's cores; None keeps the nearest measured line.
    contention: Contention | None = None
    #: Ranks per node each measured line in `lines` ran with (its devices on one node).
    line_ranks: dict[int, int] = field(default_factory=dict)
    #: The options its trials ran with (`family_options`): a swept bucket_cap_mb or
    #: accumulate_steps differs between a sweep's families.
    options: OptionsSpec = field(default_factory=OptionsSpec)
    #: Compute with activation checkpointing over compute without (`take_recompute`); 1 for
    #: a family that does not checkpoint or whose twin without was not measured.
    recompute: float = 1.0
    recompute_source: str = ""
    #: Where that factor stands in for a measurement: every device count (`twin_compute`: the
    #: family measured no compute) or the counts in `twin_lines` (measured only without).
    twin_compute: bool = False
    twin_lines: set[int] = field(default_factory=set)

    @property
    def sync(self) -> str:
        return self.settings.get("sync") or ""

    @property
    def scaling(self) -> str:
        return self.settings.get("scaling") or "weak"

    @property
    def has_compute(self) -> bool:
        return self.a_c is not None and self.b_c is not None

    def compute_s(self, batch: float, devices: int, nodes: int = 1) -> float | None:
        """Compute per step on `devices` devices over `nodes` nodes at a per-device batch, the
        wrapper included: the measured line at that device count; else, with a contention
        model, the nearest measured line (1 device included) scaled by the model's slowdown
        between the two; else the nearest measured line as it is."""
        if not self.has_compute:
            return None
        one = self.a_c + self.b_c * batch
        if devices <= 1:
            return self._wrapped(one)
        if devices in self.lines:
            a, b = self.lines[devices]
            return self._wrapped(a + b * batch)
        if self.contention is not None:
            anchor = self.contention_anchor(devices)
            base = one if anchor == 1 else self.lines[anchor][0] + self.lines[anchor][1] * batch
            ranks = math.ceil(devices / max(1, nodes))
            from_ranks = self.line_ranks.get(anchor, anchor)
            return self._wrapped(base * self.contention.ratio(one, batch, ranks, from_ranks))
        p = nearest_devices(sorted(self.lines), devices)
        if p is not None:
            a, b = self.lines[p]
            return self._wrapped(a + b * batch)
        return self._wrapped(one * self.kappa)

    def _wrapped(self, compute: float) -> float:
        """Compute with the wrapper's seconds, which a noisy 1-device pair can fit below 0
        (computefit.fit_wrapper reports it as it is); where that would leave no compute at all
        (a step cannot take negative time, and the overlap fit takes its logarithm), the
        wrapper is noise at this size and the compute stands without it."""
        wrapped = compute + self.wrapper_s
        return wrapped if wrapped > 0 else compute

    def comm_inflation(self, batch: float, devices: int, nodes: int = 1) -> float:
        """What host-side collectives (gloo) stretch by among this many ranks per node, from
        the contention model; 1 without one."""
        if self.contention is None or not self.has_compute:
            return 1.0
        ranks = math.ceil(devices / max(1, nodes))
        return self.contention.inflation(self.a_c + self.b_c * batch, batch, ranks)

    def contention_anchor(self, devices: int) -> int:
        """The measured device count (1 included) nearest `devices` on a log scale, the larger
        on a tie: the line the contention model scales from."""
        return min([1, *self.lines], key=lambda q: (abs(math.log(q / devices)), -q))

    def compute_caveat(self, devices: int, batch: float = 0.0, nodes: int = 1) -> str:
        """Where compute at `devices` was not measured: which device count stands in (and,
        with a contention model, whether the cores' load there was ever measured), and where
        it was measured only without activation checkpointing."""
        stands_in = self._stand_in_caveat(devices, batch, nodes)
        if not (self.twin_compute or devices in self.twin_lines):
            return stands_in
        recompute = (
            f"compute at {devices} devices measured without activation checkpointing, x "
            f"{self.recompute:.3g} for the recomputed forward ({self.recompute_source})"
        )
        return f"{recompute}; {stands_in}" if stands_in else recompute

    def _stand_in_caveat(self, devices: int, batch: float, nodes: int) -> str:
        if devices > 1 and devices not in self.lines and self.contention is not None:
            anchor = self.contention_anchor(devices)
            load = self.contention.load_caveat(batch, math.ceil(devices / max(1, nodes)))
            ranks = math.ceil(devices / max(1, nodes))
            k = self.contention.in_core_at(ranks)
            grown = self.contention.off_core_at(ranks) / self.contention.off_core_at(
                self.line_ranks.get(anchor, anchor)
            )
            growth = f", time off the cores x{grown:.3g}" if abs(grown - 1) >= 0.005 else ""
            return (
                f"compute at {devices} devices: measured at {anchor}, scaled by the host contention"
                f" model ({self.contention.cores:.2g} effective cores per node, CPU work x{k:.2g}"
                f"{growth})"
            ) + (f"; {load}" if load else "")
        p = nearest_devices(sorted(self.lines), devices)
        if devices > 1 and p is None and self.kappa_source.startswith("default"):
            return f"compute at {devices} devices taken as at 1 (contention not measured)"
        if devices <= 1 or p is None or p == devices:
            return ""
        return (
            f"compute at {devices} devices taken as measured at {p} (contention between "
            f"{devices} workers not measured)"
        )

    def failed(self, devices: int) -> list[BoundHit]:
        """The failed fits a prediction at `devices` uses."""
        talks = self.sync in strategies.NAMES and communicates(self.sync, devices)
        scaled = devices > 1 and devices not in self.lines
        return [
            h
            for h in self.hits
            if h.scope == "compute"
            or (h.scope == "communication" and talks)
            or (h.scope == "contention" and scaled)
        ]

    def data_wait_s(self, batch: float) -> tuple[float, str]:
        if batch in self.data_wait:
            return self.data_wait[batch], "measured at this batch"
        if self.data_wait_all is not None:
            return self.data_wait_all, "the family's median (not measured at this batch)"
        return 0.0, "none measured: taken as 0"


def fit_compute(fam: Family, points: list[Point]) -> None:
    """The family's own compute: sync none's lines per device count, else (a strategy without
    a sync-none sibling, or sync none without a 1-device run) the fallback fit."""
    if points:
        fam.micro = statistics.median(pt.micro for pt in points)
    if fam.sync in SILENT:
        obs: dict[int, list[tuple[float, float]]] = {}
        for pt in points:
            if pt.compute_s:
                obs.setdefault(pt.devices, []).append((pt.batch, pt.compute_s))
        lines = fit_lines(obs)
        if lines.one is not None:
            _take_lines(fam, lines, obs)
            _fit_contention(fam, points)
            return
    _fit_compute_fallback(fam, points)


def _take_lines(fam: Family, lines: Lines, obs: dict[int, list[tuple[float, float]]]) -> None:
    fam.a_c, fam.b_c = lines.one.a, lines.one.b
    fam.lines = dict(lines.by_devices or {})
    fam.hits = list(lines.hits)
    fam.notes += list(lines.notes)
    fam.compute_points = sum(len(v) for v in obs.values())
    counts = ", ".join(f"{len(obs[p])} at {p}" for p in sorted(obs))
    fam.compute_source = f"sync none trials, a line per device count ({counts})"
    fam.wrapper_source = "none: sync none runs no wrapper"
    if fam.lines:
        fam.kappa = lines.kappa
        fam.kappa_source = (
            f"measured: compute at {lines.kappa_devices} devices / at 1 device, batch "
            f"{lines.at_batch:g}"
        )
    else:
        fam.kappa_source = "default 1: no sync none trial on more than 1 device"


def _fit_contention(fam: Family, points: list[Point]) -> None:
    """The family's host contention model, where its 1-device sync none points say their CPU
    share and the node's cores (rows from before `host_cores` was recorded do not).

    It is fitted on the typical rank's step: each multi-device point's compute at its median
    step's share of its window step (`_typical`, relative to 1 device's). A straggler, one rank
    slow now and then, lengthens the window by a constant, which the nearest measured count's
    line carries to the counts beyond; fitted as it was, the window's, a straggler that first
    ran at 4 ranks was read as time off the cores growing 10% per added rank and 8-16 ranks came
    out 7-30% too slow (held-out sim-i and its re-run sim-k; docs/performance-history.md,
    "Session 31")."""
    for p in fam.lines:
        nodes = [pt.nodes for pt in points if pt.devices == p] or [1]
        fam.line_ranks[p] = math.ceil(p / max(1, statistics.median(nodes)))
    ones = [pt for pt in points if pt.devices == 1 and pt.compute_s and pt.host_cpu_s]
    cores = [pt.host_cores for pt in points if pt.host_cores]
    if not ones or not cores:
        return
    by_batch: dict[float, list[float]] = {}
    for pt in ones:  # CPU seconds per second of the step's compute (a core at most: see below)
        by_batch.setdefault(pt.batch, []).append(min(1.0, pt.host_cpu_s / pt.busy_s))
    share = HostShare(tuple((b, statistics.median(v)) for b, v in sorted(by_batch.items())))
    at_one: dict[float, list[float]] = {}  # `_typical` at 1 device, per batch
    for pt in points:
        if pt.devices == 1:
            at_one.setdefault(pt.batch, []).append(_typical(pt))
    observed = [
        (
            math.ceil(pt.devices / max(1, pt.nodes)),
            pt.batch,
            pt.compute_s * _typical(pt) / statistics.median(at_one.get(pt.batch, [1.0])),
            pt.host_cpu_s,
        )
        for pt in points
        if pt.devices > 1 and pt.compute_s
    ]
    one_device = [(b, fam.a_c + fam.b_c * b) for b in {b for _, b, *_ in observed}]
    fam.contention = fit_contention(share, statistics.median(cores), one_device, observed)
    if hit := fam.contention.bound_hit():
        fam.hits.append(hit)


def _typical(pt: Point) -> float:
    """The point's median step over its window step (1 where not recorded): below 1 by what
    its slowest steps (a straggler's) add to the window."""
    med, wall = pt.config.stat("step_time_s"), pt.config.step_wall
    if med is None or wall is None or not wall.median or not med.median:
        return 1.0
    return med.median / wall.median


def adopt_compute(fam: Family, sibling: Family, points: list[Point]) -> None:
    """`fam` takes its sync-none sibling's compute (x the micro-steps ratio) with what of it
    was measured only without checkpointing, and its own 1-device trials give the wrapper's
    seconds apart from it."""
    scale = fam.micro / (sibling.micro or 1.0)
    fam.a_c, fam.b_c = sibling.a_c * scale, sibling.b_c * scale
    fam.lines = {p: (a * scale, b * scale) for p, (a, b) in sibling.lines.items()}
    fam.kappa, fam.kappa_source = sibling.kappa, f"sync none's: {sibling.kappa_source}"
    fam.contention, fam.line_ranks = sibling.contention, dict(sibling.line_ranks)
    fam.compute_source = f"borrowed from sync none ({sibling.compute_source})"
    fam.recompute, fam.recompute_source = sibling.recompute, sibling.recompute_source
    fam.twin_compute, fam.twin_lines = sibling.twin_compute, set(sibling.twin_lines)
    fam.hits = [replace(h, where=h.where or "sync none's") for h in sibling.hits]
    one = [(pt.batch, pt.compute_s) for pt in points if pt.devices == 1 and pt.compute_s]
    if one:
        xs, ys = zip(*one, strict=True)
        fam.wrapper_s = fit_wrapper(xs, ys, lambda x: fam.a_c + fam.b_c * x)
        fam.wrapper_source = (
            f"fitted: {len(one)} 1-device {fam.sync} point(s) against sync none's line"
        )
    else:
        fam.wrapper_s = 0.0
        fam.wrapper_source = f"not measured (no 1-device {fam.sync} compute): taken as 0"


def _fit_compute_fallback(fam: Family, points: list[Point]) -> None:
    """No sync-none line: the family's own 1-device trials (its wrapper inside) and its
    multi-device trials through `comm_s`, scaled by a fitted kappa."""
    obs = [(pt.batch, pt.compute_s, pt.devices > 1) for pt in points if pt.compute_s]
    fam.compute_points = len(obs)
    if not obs:
        return
    fam.wrapper_source = "inside compute: no sync none run to separate it"
    one = [o for o in obs if not o[2]]
    many = [o for o in obs if o[2]]
    if one and many:
        fam.kappa = _fit_kappa(tuple(obs))
        fam.kappa_source = (
            f"fitted: {len(many)} multi-device against {len(one)} 1-device compute point(s)"
        )
        if side := on_bound(fam.kappa, *KAPPA_RANGE):
            fam.hits.append(_kappa_hit(fam.kappa, side))
    line = _line_fit(obs, fam.kappa)
    fam.a_c, fam.b_c = line.a, line.b
    fam.hits += list(line.hits)
    parts = []
    if one:
        parts.append(f"{len(one)} 1-device or sync none point(s)")
    if many:
        parts.append(f"{len(many)} multi-device point(s) (step - data wait - comm_s)")
    fam.compute_source = " + ".join(parts)
    if len({o[0] for o in obs}) < 2:
        fam.notes.append("compute measured at one batch size only: taken proportional to it")


def _kappa_hit(kappa: float, side: str) -> BoundHit:
    lo, hi = KAPPA_RANGE
    if side == "lower":
        meaning = (
            f"compute on several devices would run {1 / lo:g}x faster than on one, which "
            "cannot be: step minus comm_s is not compute there (comm_s overstates the "
            "communication); a sync none trial at each device count measures compute"
        )
        return BoundHit("kappa", kappa, lo, side, meaning)
    meaning = (
        f"compute on several devices {hi:g}x slower than on one or more: comm_s misses part "
        "of the communication, or the contention is beyond the range"
    )
    return BoundHit("kappa", kappa, hi, side, meaning)


@functools.lru_cache(maxsize=1024)
def _fit_kappa(obs: tuple[tuple[float, float, bool], ...]) -> float:
    """Cached: a leave-one-out refit sees the same observations in every family but one."""
    return minimize_scalar(lambda k: _line_fit(obs, k).sse, *KAPPA_RANGE, log=True)


def _line_fit(
    obs: tuple[tuple[float, float, bool], ...] | list[tuple[float, float, bool]], kappa: float
) -> Line:
    """T = a + b x (x kappa for multi-device observations): computefit.fit_line."""
    xs = [x for x, _, _ in obs]
    ys = [t / (kappa if multi else 1.0) for _, t, multi in obs]
    return fit_line(xs, ys)


def fit_data_wait(fam: Family, points: list[Point]) -> None:
    by_batch: dict[float, list[float]] = {}
    for pt in points:
        if pt.data_wait_s is not None:
            by_batch.setdefault(pt.batch, []).append(pt.data_wait_s)
    fam.data_wait = {b: statistics.median(v) for b, v in by_batch.items()}
    waits = [w for v in by_batch.values() for w in v]
    fam.data_wait_all = statistics.median(waits) if waits else None


#: The activation_checkpointing value that recomputes nothing: a checkpointed family's twin's.
NO_CHECKPOINTING = AXIS_TABLE["activation_checkpointing"].default


def twin_key(fam: Family) -> tuple | None:
    """The family of `fam`'s settings without activation checkpointing (its twin); None where
    `fam` does not checkpoint."""
    if fam.settings.get("activation_checkpointing") in (None, NO_CHECKPOINTING):
        return None
    return family_key({**fam.settings, "activation_checkpointing": NO_CHECKPOINTING})


def take_recompute(
    fam: Family, twin: Family, points: list[Point], twin_points: list[Point]
) -> None:
    """A checkpointed family's compute where its trials did not measure it, from its `twin`
    (the same settings without checkpointing): compute with = compute without x `recompute`.

    One factor on the whole compute, not a term of its own: checkpointing adds the blocks'
    forward again inside the backward, and a family's compute is already one line per device
    count, so the factor carries the twin's lines (contention included) to the counts the
    family lacks, and to every count where it measured no compute. The factor is measured
    where both ran on one device (their compute at the family's median batch: the time the
    recompute costs, which on the 2-core CPU box was 1.36x (selective) and 1.58x (full) of a
    GPT step against 1.11x and 1.21x its FLOPs), else the ratio of their hardware FLOPs per
    sample (`flops_hardware` counts the recomputed forward, model FLOPs do not), said so:
    FLOPs understate the time where the recompute runs slower than the rest."""
    if fam.twin_compute or fam.twin_lines:  # already taken through its sync-none sibling
        return
    factor = _recompute_factor(fam, twin, points, twin_points)
    if factor is None:
        return
    r, fam.recompute_source = factor
    fam.recompute = r
    if not fam.has_compute:
        fam.twin_compute = True
        fam.a_c, fam.b_c = twin.a_c * r, twin.b_c * r
        fam.wrapper_s, fam.wrapper_source = twin.wrapper_s, twin.wrapper_source
        fam.kappa, fam.kappa_source = twin.kappa, twin.kappa_source
        fam.contention, fam.line_ranks = twin.contention, dict(twin.line_ranks)
        fam.hits = [replace(h, where=h.where or "without checkpointing") for h in twin.hits]
        fam.compute_source = f"without checkpointing x {r:.3g} ({twin.compute_source})"
    elif fam.kappa_source.startswith("default") and not twin.kappa_source.startswith("default"):
        fam.kappa, fam.kappa_source = twin.kappa, f"without checkpointing: {twin.kappa_source}"
    for p, (a, b) in twin.lines.items():
        if p not in fam.lines:
            fam.lines[p] = (a * r, b * r)
            fam.line_ranks[p] = twin.line_ranks.get(p, p)
            fam.twin_lines.add(p)
    if fam.contention is None:
        fam.contention = twin.contention


def _recompute_factor(
    fam: Family, twin: Family, points: list[Point], twin_points: list[Point]
) -> tuple[float, str] | None:
    """(compute with checkpointing / without, how it was read), or None where neither the
    1-device compute of both nor the hardware FLOPs of both were measured."""
    ones = [pt.batch for pt in points if pt.devices == 1 and pt.compute_s]
    twin_ones = any(pt.devices == 1 and pt.compute_s for pt in twin_points)
    if ones and twin_ones and fam.has_compute:
        batch = statistics.median(ones)
        with_, without = fam.compute_s(batch, 1), twin.compute_s(batch, 1)
        if with_ and without and with_ > 0 and without > 0:
            return with_ / without, f"measured: 1-device compute with / without at batch {batch:g}"
    with_flops, without_flops = _hardware_flops(points), _hardware_flops(twin_points)
    if with_flops and without_flops:
        return (
            with_flops / without_flops,
            "hardware FLOPs per sample with / without, not measured in time",
        )
    return None


def _hardware_flops(points: list[Point]) -> float | None:
    """The median hardware FLOPs per sample (`flops_hardware`) the points' rows counted."""
    values = [s.median for pt in points if (s := pt.config.stat("flops_hardware"))]
    return statistics.median(values) if values else None
