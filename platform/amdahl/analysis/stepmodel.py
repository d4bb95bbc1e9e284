"""The step-time model: per configuration family, the terms below fitted from the measured
points (analysis/points.py), and the prediction of one family at a device count, per-device
batch and node count. It predicts configurations the sweep did not measure (other device counts,
batch sizes, node counts) from results.parquet plus calibration.json; analysis/prediction.py
puts it to use.

Per configuration family (every setting except the device count and the per-device batch):

    compute        T_c(b, p) = a_p + b_p * b              (per measured device count p, fitted
                                                           on sync none: analysis/computefit.py;
                                                           an unmeasured p: the nearest line x
                                                           host contention, contention.py)
                   + omega                                (the strategy's wrapper, per step)
    communication  T_n(p) = latency_steps * alpha(p) + bytes(sync, p, options) / B(p)
                   x theta                                (fitted per strategy, 1 if unknown)
    step           (T_c^gamma + T_n^gamma)^(1/gamma)      (Pollux's overlap exponent, 1..8:
                                                           analysis/overlapfit.py)
    wall per step  step + data wait                       (the family's measured data wait)
    throughput     global batch / wall per step

Compute is fitted from what compute is: the `sync: none` sibling's trials give a line at 1
device (a_c, b_c) and one at each device count measured (contention measured, not assumed; kappa
reported as the ratio at the largest); an unmeasured count takes the nearest line times the
slowdown of the host-contention model (analysis/contention.py) between the two, and says so.
omega is the wrapper's cost (DDP's reducer on one device): the strategy's 1-device trials minus
the sync-none line. Without a sync-none sibling, the family's own trials (wrapper inseparable;
multi-device ones through `comm_s`, scaled by a fitted kappa). gamma and theta are fitted per
sync strategy over its multi-device trials (squared log error of the step, plus a small penalty
on log theta), else pooled, else 1 and 1: gamma is 1, known, where the strategy's gradient is one
DDP bucket (no overlap: comm.no_overlap), and theta is fixed near 1 where the points cannot
separate the two. theta is what the strategy's communication costs against the calibrated ring
(ZeRO's partition broadcast, PowerSGD's factorisation, hook casts, comm threads taking cores).

A fitted parameter on a bound of its range (theta at 1/4 or 16, a fitted kappa at 1/4 or 4, a
compute line's intercept or slope forced to 0) is a failed fit (`computefit.BoundHit`): the
family lists it and `predict` withholds the predictions that use it (`withhold=False`, for
checks, gives them flagged). gamma's ends are not failures: 1 is no overlap and 8 is, within
9%, full overlap, both states a system can be in.

alpha and B come from calibration.json (`alpha_s`, `bandwidth_Bps`, measured within a node by
`platform calibrate`, and `by_devices`: the same at smaller device counts, from which
analysis/comm.py fits how they grow with p; gloo's counts above the node's cores fit a law of
their own, whose link holds the queueing, not stretched again). With `inter_node_alpha_s` and
`inter_node_bandwidth_Bps` (put there by hand: `platform calibrate` does not measure across
nodes), a prediction that spans nodes uses those for every collective (a ring across nodes runs
at its slowest link); without them, the intra-node terms, said. Bytes per optimizer step:
comm.comm_volume, from calibration.json's `grad_bytes_for(params)` (no row holds gradient
bytes; PowerSGD needs `param_shapes_by_params`, else labels an estimate). Data wait is not
modelled: the family's measured per-step wait at the same per-device batch (else its median).

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from amdahl import strategies
from amdahl.analysis.calibration import Calibration
from amdahl.analysis.comm import (
    CommModel,
    CommVolume,
    Link,
    comm_model,
    comm_volume,
    communicates,
    no_overlap,
)
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
from amdahl.analysis.configs import NO_SYNC, Config
from amdahl.analysis.contention import Contention, HostShare, fit_contention
from amdahl.analysis.overlapfit import THETA_RANGE, combine, fit_overlap, theta_hit
from amdahl.analysis.points import (
    FAMILY_SETTINGS,
    Point,
    family_key,
    family_micro_steps,
    measured_point,
)
from amdahl.analysis.stats import minimize_scalar
from amdahl.spec.schema import OptionsSpec

KAPPA_RANGE = (0.25, 4.0)
#: Strategies that never communicate (`none`, the ceiling), from the strategy table.
SILENT = frozenset(n for n, s in strategies.STRATEGIES.items() if not s.communicates)


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
            return one + self.wrapper_s
        if devices in self.lines:
            a, b = self.lines[devices]
            return a + b * batch + self.wrapper_s
        if self.contention is not None:
            anchor = self.contention_anchor(devices)
            base = one if anchor == 1 else self.lines[anchor][0] + self.lines[anchor][1] * batch
            ranks = math.ceil(devices / max(1, nodes))
            from_ranks = self.line_ranks.get(anchor, anchor)
            return base * self.contention.ratio(one, batch, ranks, from_ranks) + self.wrapper_s
        p = nearest_devices(sorted(self.lines), devices)
        if p is not None:
            a, b = self.lines[p]
            return a + b * batch + self.wrapper_s
        return one * self.kappa + self.wrapper_s

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
        with a contention model, whether the cores' load there was ever measured)."""
        if devices > 1 and devices not in self.lines and self.contention is not None:
            anchor = self.contention_anchor(devices)
            load = self.contention.load_caveat(batch, math.ceil(devices / max(1, nodes)))
            k = self.contention.in_core_at(math.ceil(devices / max(1, nodes)))
            return (
                f"compute at {devices} devices: measured at {anchor}, scaled by the host contention"
                f" model ({self.contention.cores:.2g} effective cores per node, CPU work x{k:.2g})"
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


@dataclass(frozen=True)
class Prediction:
    devices: int
    batch: float  # per device
    nodes: int
    compute_s: float | None = None
    comm_s: float | None = None
    data_wait_s: float | None = None
    step_s: float | None = None
    throughput: float | None = None
    volume: CommVolume | None = None
    link: Link | None = None
    unknown: str = ""  # why there is no prediction
    caveats: tuple[str, ...] = ()
    failed_fit: tuple[str, ...] = ()  # the failed fits it uses (withheld unless asked for)


@dataclass
class StepModel:
    families: dict[tuple, Family]
    comm: CommModel
    options: OptionsSpec
    #: sync -> (gamma, theta, points)
    overlaps: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    pooled_overlap: tuple[float, float, int] | None = None
    #: The widest device count whose measured steps gamma and theta were fitted on.
    widest_fitted: int = 0

    def host_comm(self, family: Family, batch: float, devices: int, nodes: int) -> float:
        """The contention factor of the communication term: gloo's collectives are host work
        (each ring step needs a core), so they stretch as the ranks' compute fills the cores;
        NCCL's run on the devices (1)."""
        if self.comm.backend != "gloo" or self.comm.queueing_measured(devices, nodes):
            return 1.0
        return family.comm_inflation(batch, devices, nodes)

    def family_of(self, c: Config) -> Family | None:
        return self.families.get(family_key(c.settings))

    def predict(
        self, family: Family, devices: int, batch: float, nodes: int = 1, *, withhold: bool = True
    ) -> Prediction:
        """The family at `devices` x per-device `batch` on `nodes`. A prediction that uses a
        failed fit (a parameter on a bound) is withheld, or with `withhold=False` made and
        flagged (for checks of the model, never for users' figures)."""
        p, nodes = max(1, int(devices)), max(1, int(nodes))
        compute = family.compute_s(batch, p, nodes)
        if compute is None:
            why = "no compute measurement in this family or its sync none sibling"
            return Prediction(p, batch, nodes, unknown=why)
        failed = tuple(h.short() for h in family.failed(p))
        if failed and withhold:
            why = "withheld, failed fit (what it means: above): " + "; ".join(failed)
            return Prediction(p, batch, nodes, unknown=why, failed_fit=failed)
        caveats = [f"FAILED FIT: {f}" for f in failed]
        if note := family.compute_caveat(p, batch, nodes):
            caveats.append(note)
        if family.sync not in strategies.NAMES:
            return Prediction(p, batch, nodes, compute, unknown=f"unknown sync {family.sync!r}")
        comm = self._comm_part(family, p, batch, nodes)
        if isinstance(comm, str):
            return Prediction(p, batch, nodes, compute, unknown=comm)
        caveats.extend(comm.caveats)
        step = combine(compute, comm.comm_s, family.gamma)
        wait, how = family.data_wait_s(batch)
        if how != "measured at this batch":
            caveats.append(f"data wait {how}")
        return replace(
            comm,
            compute_s=compute,
            data_wait_s=wait,
            step_s=step,
            throughput=batch * p * family.micro / (step + wait),
            caveats=tuple(caveats),
            failed_fit=failed,
        )

    def _comm_part(self, family: Family, p: int, batch: float, nodes: int) -> Prediction | str:
        """`family`'s prediction at `p` devices as far as its communication goes (`comm_s`,
        `volume`, `link` and their caveats), or why the model has none (no link calibrated, no
        gradient bytes)."""
        if not communicates(family.sync, p):
            return Prediction(p, batch, nodes, comm_s=0.0)
        link, caveat = self.comm.link(nodes, p)
        if link is None:
            return (
                "no communication model: no calibration.json with alpha and "
                "bandwidth (run `platform calibrate DIR --devices N`)"
            )
        if not family.grad_bytes:
            return (
                "gradient bytes unknown (not in calibration.json: run "
                "`platform calibrate` with the sweep's spec.yaml in DIR)"
            )
        caveats = [caveat] if caveat else []
        if (span := self.comm.calibrated_range) and p > max(span[1], self.widest_fitted):
            caveats.append(
                f"communication at {p} devices: {self.comm.growth()}; where the cluster "
                f"holds {p}, `platform calibrate DIR --devices {p}` measures it in seconds"
            )
        volume = comm_volume(family.sync, p, family.grad_bytes, self.options, family.shapes)
        if volume.estimate:
            caveats.append(volume.estimate)
        seconds = volume.seconds(link) * family.theta * self.host_comm(family, batch, p, nodes)
        return Prediction(
            p, batch, nodes, comm_s=seconds, volume=volume, link=link, caveats=tuple(caveats)
        )


@dataclass
class ModelInputs:
    """What the model is fitted from: the sweep's configurations, calibration and options."""

    configs: list[Config]
    calibration: Calibration | None = None
    options: OptionsSpec = field(default_factory=OptionsSpec)
    price: float = 0.0
    name: str = "sweep"
    notes: list[str] = field(default_factory=list)
    #: The memory probe's facts by (workload parameters as JSON, precision), from plan.json:
    #: `platform predict`'s memory per device (analysis/memory_model.py).
    memory_facts: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: Bytes per device the rows hold beyond the memory model (memory_model.Overhead).
    memory_overhead_bytes: float = 0.0

    def points(self) -> list[Point]:
        return [pt for c in self.configs if (pt := measured_point(c)) is not None]


def fit(inputs: ModelInputs, points: list[Point] | None = None) -> StepModel:
    """Fit every family's compute line, kappa and gamma from `points` (default: all measured)."""
    points = inputs.points() if points is None else points
    cores = [pt.host_cores for pt in points if pt.host_cores]
    comm = comm_model(inputs.calibration, statistics.median(cores) if cores else None)
    model = StepModel({}, comm, inputs.options)
    by_family: dict[tuple, list[Point]] = {}
    for c in inputs.configs:  # every family, measured or not, in the report's order
        key = family_key(c.settings)
        if key not in model.families:
            model.families[key] = _new_family(key, c, inputs)
            by_family[key] = []
    for pt in points:
        by_family.setdefault(pt.family, []).append(pt)
    for key, fam in model.families.items():
        _fit_compute(fam, by_family[key])
        _fit_data_wait(fam, by_family[key])
    sync_i = FAMILY_SETTINGS.index("sync")
    for key, fam in model.families.items():
        sibling = model.families.get((*key[:sync_i], NO_SYNC, *key[sync_i + 1 :]))
        if sibling is not None and sibling is not fam and sibling.has_compute:
            _adopt_compute(fam, sibling, by_family[key])
    _fit_overlaps(model, points)
    return model


def _new_family(key: tuple, c: Config, inputs: ModelInputs) -> Family:
    settings = dict(zip(FAMILY_SETTINGS, key, strict=True))
    label = " ".join(c.label.split(" ")[2:])
    fam = Family(key=key, label=label, settings=settings)
    if inputs.calibration is not None:
        fam.grad_bytes = inputs.calibration.grad_bytes_for(settings.get("params"))
        fam.shapes = inputs.calibration.shapes_for(settings.get("params"))
    fam.micro = float(family_micro_steps(settings, inputs.options.model_dump()))
    return fam


def _fit_compute(fam: Family, points: list[Point]) -> None:
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
    share and the node's cores (rows from before `host_cores` was recorded do not)."""
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
    observed = [
        (math.ceil(pt.devices / max(1, pt.nodes)), pt.batch, pt.compute_s, pt.host_cpu_s)
        for pt in points
        if pt.devices > 1 and pt.compute_s
    ]
    one_device = [(b, fam.a_c + fam.b_c * b) for b in {b for _, b, *_ in observed}]
    fam.contention = fit_contention(share, statistics.median(cores), one_device, observed)
    if hit := fam.contention.bound_hit():
        fam.hits.append(hit)


def _adopt_compute(fam: Family, sibling: Family, points: list[Point]) -> None:
    """`fam` takes its sync-none sibling's compute (x the micro-steps ratio), and its own
    1-device trials give the wrapper's seconds apart from it."""
    scale = fam.micro / (sibling.micro or 1.0)
    fam.a_c, fam.b_c = sibling.a_c * scale, sibling.b_c * scale
    fam.lines = {p: (a * scale, b * scale) for p, (a, b) in sibling.lines.items()}
    fam.kappa, fam.kappa_source = sibling.kappa, f"sync none's: {sibling.kappa_source}"
    fam.contention, fam.line_ranks = sibling.contention, dict(sibling.line_ranks)
    fam.compute_source = f"borrowed from sync none ({sibling.compute_source})"
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


def _fit_data_wait(fam: Family, points: list[Point]) -> None:
    by_batch: dict[float, list[float]] = {}
    for pt in points:
        if pt.data_wait_s is not None:
            by_batch.setdefault(pt.batch, []).append(pt.data_wait_s)
    fam.data_wait = {b: statistics.median(v) for b, v in by_batch.items()}
    waits = [w for v in by_batch.values() for w in v]
    fam.data_wait_all = statistics.median(waits) if waits else None


def _fit_overlaps(model: StepModel, points: list[Point]) -> None:
    """gamma and theta per sync strategy over its multi-device points with a communication term."""
    pairs = _overlap_observations(model, points)
    notes: dict[str, str] = {}
    for sync, obs in pairs.items():
        grads = [f.grad_bytes for f in model.families.values() if f.sync == sync]
        gamma, theta, notes[sync] = fit_overlap(tuple(obs), no_overlap(sync, grads, model.options))
        model.overlaps[sync] = (gamma, theta, len(obs))
    everything = tuple(o for obs in pairs.values() for o in obs)
    needed = any(
        f.sync not in model.overlaps and f.sync not in SILENT for f in model.families.values()
    )
    pooled_note = ""
    if everything and needed:
        gamma, theta, pooled_note = fit_overlap(everything)
        model.pooled_overlap = (gamma, theta, len(everything))
    for fam in model.families.values():
        if fam.sync in SILENT:
            fam.gamma_source = "not used: no communication"
            continue
        if fam.sync in model.overlaps:
            fam.gamma, fam.theta, n = model.overlaps[fam.sync]
            source, note = f"fitted over {n} multi-device {fam.sync} point(s)", notes[fam.sync]
        elif model.pooled_overlap:
            fam.gamma, fam.theta, n = model.pooled_overlap
            source = f"pooled over {n} multi-device point(s) of other strategies"
            note = pooled_note
        else:
            continue
        fam.gamma_source = f"gamma and theta {source}" + (f" ({note})" if note else "")
        if side := on_bound(fam.theta, *THETA_RANGE):
            fam.hits.append(theta_hit(fam.theta, side))


def _overlap_observations(
    model: StepModel, points: list[Point]
) -> dict[str, list[tuple[float, float, float]]]:
    """Per sync strategy, (compute, calibrated comm, busy step) of each communicating point."""
    pairs: dict[str, list[tuple[float, float, float]]] = {}
    for pt in points:
        fam = model.families.get(pt.family)
        if fam is None or pt.devices <= 1 or fam.sync in SILENT or not fam.sync:
            continue
        compute = fam.compute_s(pt.batch, pt.devices, pt.nodes)
        link, _ = model.comm.link(pt.nodes, pt.devices)
        if compute is None or link is None or not fam.grad_bytes:
            continue
        volume = comm_volume(fam.sync, pt.devices, fam.grad_bytes, model.options, fam.shapes)
        comm = volume.seconds(link) if volume else 0.0
        comm *= model.host_comm(fam, pt.batch, pt.devices, pt.nodes)
        if comm > 0:
            pairs.setdefault(fam.sync, []).append((compute, comm, pt.busy_s))
            model.widest_fitted = max(model.widest_fitted, pt.devices)
    return pairs
