"""What a sync strategy communicates per optimizer step, and the calibrated links it runs over:
the communication term of the step-time model (analysis/stepmodel.py).

Ring collectives: an all-reduce moves 2(p-1)/p x n bytes per rank in 2(p-1) latency steps, a
reduce-scatter or all-gather (p-1)/p x n in (p-1). A volume's time on a link is
latency_steps x alpha + bytes / B, alpha and B from calibration.json: measured within a node by
`platform calibrate`, across nodes only where the file has `inter_node_alpha_s` and
`inter_node_bandwidth_Bps` (put there by hand). The strategy table (strategies.py) says which
strategies communicate and the wire factor of the DDP-like ones; each other strategy has its
own volume function below.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from amdahl import strategies
from amdahl.analysis.calibration import Calibration
from amdahl.analysis.stats import is_number
from amdahl.spec.schema import OptionsSpec

#: torch's PowerSGDState default: a matrix is compressed only when that divides its size by more.
POWERSGD_MIN_COMPRESSION = 2


def communicates(sync: str, devices: int) -> bool:
    """Whether `sync` moves data on `devices` ranks (the strategy table's `communicates` and
    `communicates_alone`); a name the table lacks is taken as one that communicates on p > 1."""
    strategy = strategies.STRATEGIES.get(sync)
    if strategy is None:
        return devices > 1
    return strategy.communicates and (devices > 1 or strategy.communicates_alone)


def options_from_mapping(spec: Any) -> OptionsSpec:
    """The options of a spec.yaml mapping (its `options` section) as the model reads them.

    Tolerant, as a sweep directory's file may be odd or hand-edited: each option a strategy reads
    (strategies.OPTION_DEFAULTS) is taken where it is a positive number, converted to its
    default's type (2.7 -> 2 for a count), else left at its default, and the rest of the section
    is ignored. Built without validation on purpose: validation would refuse the whole section
    over one odd value, where the model only needs these numbers."""
    raw = (spec.get("options") if isinstance(spec, dict) else None) or {}
    values = {}
    for name, default in strategies.OPTION_DEFAULTS.items():
        v = raw.get(name) if isinstance(raw, dict) else None
        if is_number(v) and v > 0:
            values[name] = type(default)(v)
    return OptionsSpec.model_construct(**values)


# --------------------------------------------------------------------------- volumes


@dataclass(frozen=True)
class Link:
    alpha_s: float
    bandwidth_Bps: float
    scope: str  # "intra-node" or "inter-node"


@dataclass(frozen=True)
class CommVolume:
    """What one rank moves per optimizer step: `bytes` over the link's bandwidth, plus
    `latency_steps` times the link's alpha."""

    bytes: float
    latency_steps: float
    model: str
    estimate: str = ""  # why a stand-in was used, when one was

    def seconds(self, link: Link) -> float:
        return self.latency_steps * link.alpha_s + self.bytes / link.bandwidth_Bps


def ddp_buckets(grad_bytes: float, options: OptionsSpec) -> int:
    """DDP's gradient buckets, each one all-reduce: ceil(gradient bytes / bucket_cap_mb)."""
    return max(1, math.ceil(grad_bytes / (options.bucket_cap_mb * 2**20)))


def no_overlap(sync: str, grad_bytes: list[float | None], options: OptionsSpec) -> str:
    """Why `sync` cannot overlap its communication with the backward, or "": a strategy on
    DDP's reducer (it reads `bucket_cap_mb`) whose gradient fits one bucket, in every family
    (`grad_bytes`, each known), launches that bucket's all-reduce only once the backward has
    produced every gradient."""
    strategy = strategies.STRATEGIES.get(sync)
    if strategy is None or "bucket_cap_mb" not in strategy.options or not grad_bytes:
        return ""
    if not all(grad_bytes) or max(ddp_buckets(g, options) for g in grad_bytes) > 1:
        return ""
    return f"one DDP bucket (at most {max(grad_bytes) / 2**20:.3g} MiB): no overlap with backward"


def powersgd_elements(shapes: list[list[int]], rank: int) -> tuple[float, float]:
    """(elements PowerSGD all-reduces, elements of the gradient). A parameter of 2 or more
    dimensions, viewed as rows = shape[0] by cols = the rest, travels as its rank-r factors
    P (rows x r) and Q (cols x r) when (rows + cols) * r * 2 < rows * cols (torch's rule),
    else whole, like every 1-D parameter."""
    sent = total = 0.0
    for shape in shapes:
        n = float(math.prod(shape))
        total += n
        if len(shape) >= 2 and shape[0] > 0:
            rows, cols = shape[0], n / shape[0]
            factors = (rows + cols) * rank
            if factors * POWERSGD_MIN_COMPRESSION < n:
                sent += factors
                continue
        sent += n
    return sent, total


def comm_volume(
    sync: str,
    devices: int,
    grad_bytes: float,
    options: OptionsSpec | None = None,
    shapes: list[list[int]] | None = None,
) -> CommVolume | None:
    """Bytes and latency terms per optimizer step of a sync strategy on `devices` ranks, for a
    model with `grad_bytes` of fp32 gradients; None for a strategy the model does not know.

    Strategies with a `wire_factor` in the table (ddp, accumulate, ddp_fp16, ddp_bf16) all-reduce
    the gradient once per optimizer step (`_gradient_all_reduce`); every other one that
    communicates has its own function in `_OWN_VOLUME`; `none` moves nothing.
    """
    options = OptionsSpec() if options is None else options
    p = max(1, int(devices))
    g = float(grad_bytes)
    if sync not in strategies.NAMES:
        return None
    if not communicates(sync, p):
        return CommVolume(0.0, 0.0, "no communication")
    if sync in _OWN_VOLUME:
        return _OWN_VOLUME[sync](p, g, options, shapes)
    wire = strategies.STRATEGIES[sync].wire_factor
    if wire is None:  # test_strategies checks that every strategy has a volume
        raise AssertionError(f"no communication volume for sync {sync!r}")
    return _gradient_all_reduce(p, g, wire, options)


def _gradient_all_reduce(p: int, g: float, wire: float, options: OptionsSpec) -> CommVolume:
    """DDP and its compression hooks: one ring all-reduce of the gradient per optimizer step
    (accumulating, after the last of its micro-steps) at the table's `wire_factor` of its bytes
    (the 2-byte hooks: half), per bucket (`ddp_buckets`), each bucket paying the latency."""
    buckets = ddp_buckets(g, options)
    as_sent = "" if wire == 1 else f" at {wire:g} of its bytes"
    return CommVolume(
        2 * (p - 1) / p * g * wire,
        2 * (p - 1) * buckets,
        f"ring all-reduce of the gradient{as_sent} ({buckets} bucket(s))",
    )


def _param_server(p: int, g: float, options: OptionsSpec, shapes: Any) -> CommVolume:
    """Each worker pushes its gradient and pulls the parameters once per step; each of the
    `ps_shards` shards serves all p workers, so the busiest link carries 2 n max(1, p / shards)
    bytes, with one round trip (2 latency terms); the calibrated collective's alpha and B stand
    in for Ray's object transfer (rough). It communicates with one device too."""
    shards = max(1, options.ps_shards)
    return CommVolume(
        2 * g * max(1.0, p / shards),
        2.0,
        f"push + pull of the gradient through {shards} parameter-server shard(s)",
    )


def _powersgd(p: int, g: float, options: OptionsSpec, shapes: list[list[int]] | None) -> CommVolume:
    """Per bucket, three all-reduces (the uncompressed tensors, the P and the Q factors) of
    `powersgd_elements`; without shapes the gradient is taken as one square matrix (an
    estimate, labelled)."""
    r = max(1, options.powersgd_rank)
    estimate = ""
    if shapes:
        sent, total = powersgd_elements(shapes, r)
    else:
        side = round(math.sqrt(g / 4))
        sent, total = powersgd_elements([[side, side]], r)
        estimate = (
            "no parameter shapes in calibration.json: the gradient taken as one square "
            "matrix (run `platform calibrate` again to record the shapes)"
        )
    wire = g * sent / total if total else 0.0
    return CommVolume(
        2 * (p - 1) / p * wire,
        3 * 2 * (p - 1) * ddp_buckets(g, options),
        f"ring all-reduce of rank-{r} factors ({sent / total:.1%} of the gradient)"
        if total
        else "ring all-reduce of rank-r factors",
        estimate,
    )


def _zero1(p: int, g: float, options: OptionsSpec, shapes: Any) -> CommVolume:
    """As worker/sync.py builds it: DDP's gradient all-reduce, then ZeroRedundancyOptimizer
    broadcasts each rank's updated partition, (p-1)/p x n more bytes per rank, 3(p-1)/p in all
    (a ZeRO-1 that reduce-scatters instead would move 2(p-1)/p)."""
    return CommVolume(
        2 * (p - 1) / p * g + (p - 1) / p * g,
        2 * (p - 1) * ddp_buckets(g, options) + (p - 1),
        "gradient all-reduce + partition broadcasts (3(p-1)/p of the gradient)",
    )


def _fsdp(p: int, g: float, options: OptionsSpec, shapes: Any) -> CommVolume:
    """All-gather (forward) + all-gather (backward) + reduce-scatter, 3(p-1)/p x n, one latency
    term per collective (FSDP units are not counted)."""
    return CommVolume(
        3 * ((p - 1) / p) * g,
        3 * (p - 1),
        "all-gather x2 + reduce-scatter (3(p-1)/p of the gradient)",
    )


def _local_sgd(p: int, g: float, options: OptionsSpec, shapes: Any) -> CommVolume:
    """One all-reduce of the parameters (as many bytes as the gradient) every
    `local_sgd_every` steps, amortised per step."""
    every = max(1, options.local_sgd_every)
    return CommVolume(
        2 * (p - 1) / p * g / every,
        2 * (p - 1) / every,
        f"ring all-reduce of the parameters every {every} steps",
    )


#: The strategies that communicate otherwise than one all-reduce of the gradient.
_OWN_VOLUME: dict[str, Callable[..., CommVolume]] = {
    "param_server": _param_server,
    "powersgd": _powersgd,
    "zero1": _zero1,
    "fsdp": _fsdp,
    "local_sgd": _local_sgd,
}


# --------------------------------------------------------------------------- links


#: Growth exponents of alpha and 1/B with the device count are fitted within this range: a
#: ring step never gets cheaper with more ranks (gloo's 2-4-rank calibrations on 16 cores fell
#: with p, other algorithms at 2 ranks; extrapolated, 16 ranks came out 100-125% too fast).
GROWTH_RANGE = (0.0, 2.0)


@dataclass(frozen=True)
class Oversubscribed:
    """How a gloo collective grows once a node holds more ranks than cores, fitted over the
    calibrated counts above the cores (`counts`), from the link at the cores (`anchor`):

        alpha(p) = alpha_C (1 + alpha_log x ln(p / C)),   1/B(p) = 1/B_C x (p / C)^bandwidth_exp

    Every ring step then waits for a process to get a core. The step's latency grows with the
    ranks per core, but more slowly than the ranks: a woken rank finds more of its messages
    already there. A power law fitted at 3-4 ranks on 2 cores put 16 ranks' alpha 2.2x too
    high; this log law put alpha within -6% to +26% of the 8- and 16-rank calibrations of four
    calibrations on that box, 7 of the 8 within 6% (docs/performance-history.md, "gloo beyond
    the node's cores")."""

    cores: float
    anchor: Link
    alpha_log: float
    bandwidth_exp: float
    measured: dict[int, Link]  # the calibrated counts above the cores

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(sorted(self.measured))

    def link(self, devices: int) -> Link:
        """The calibrated link at `devices` where measured, else the law's."""
        if devices in self.measured:
            return self.measured[devices]
        x = math.log(max(devices, self.cores) / self.cores)
        return Link(
            self.anchor.alpha_s * (1 + self.alpha_log * x),
            self.anchor.bandwidth_Bps * math.exp(-self.bandwidth_exp * x),
            self.anchor.scope,
        )

    def held(self) -> Oversubscribed:
        """The alternative the calibration cannot rule out beyond its widest count: the link
        held there, with no further growth. In training, a ring's steps wait less for cores
        than in a calibration whose every rank is in the collective at once: on a 1 MiB set
        the law put PowerSGD's time beyond sync none's 9x up from 4 to 16 ranks where the
        measured grew 4.5x, about the ring's steps alone; on a 4 MiB set DDP's grew faster than
        the law (docs/performance-history.md, "The law's alternative")."""
        widest = max(self.measured)
        return replace(self, anchor=self.measured[widest], alpha_log=0.0, bandwidth_exp=0.0)

    def describe(self) -> str:
        return (
            f"above the node's {self.cores:g} cores (gloo ranks queue for them): alpha x "
            f"(1 + {self.alpha_log:.2f} ln(p/{self.cores:g})), 1/B x (p/{self.cores:g})^"
            f"{self.bandwidth_exp:.2f}, fitted at {', '.join(map(str, self.counts))}"
        )


@dataclass(frozen=True)
class CommModel:
    """The calibrated links: within a node (calibration.json's alpha_s, bandwidth_Bps, at
    `calibrated_devices`) and, when given, across nodes; and how the intra-node terms grow with
    the device count, fitted over the device counts the calibration measured (`by_devices`):

        alpha(p) = alpha (p / P)^alpha_exp,   B(p) = B (p / P)^-bandwidth_exp

    on top of the ring's 2(p-1) latency steps and 2(p-1)/p bytes: 0 and 0 where the ring
    describes the links (NCCL within a node), more where a tree takes over. gloo counts above
    the node's cores follow their own law (`oversubscribed`), since there the ranks queue for
    cores as much as they wait on links."""

    intra: Link | None
    inter: Link | None = None
    backend: str = ""
    calibrated_devices: int | None = None
    by_devices: dict[int, Link] = field(default_factory=dict)
    alpha_exp: float = 0.0
    bandwidth_exp: float = 0.0
    reused_from: str = ""  # the calibration's source where an earlier sweep measured it
    oversubscribed: Oversubscribed | None = None

    @property
    def calibrated_range(self) -> tuple[int, int] | None:
        counts = sorted(self.by_devices) or (
            [self.calibrated_devices] if self.calibrated_devices else []
        )
        if self.oversubscribed is not None:
            counts = sorted({*counts, *self.oversubscribed.counts})
        return (counts[0], counts[-1]) if counts else None

    def growth(self) -> str:
        """How alpha and B are taken to grow with the device count, and from what."""
        over = f"; {self.oversubscribed.describe()}" if self.oversubscribed else ""
        if len(self.by_devices) < 2:
            at = f" at {self.calibrated_devices} devices" if self.calibrated_devices else ""
            return f"the ring's 2(p-1) steps assumed: all-reduce calibrated{at} only{over}"
        lo, hi = min(self.by_devices), max(self.by_devices)
        return (
            f"calibrated at {lo}-{hi} devices: alpha x p^{self.alpha_exp:.2f} and 1/B x "
            f"p^{self.bandwidth_exp:.2f} on top of the ring's 2(p-1) steps{over}"
        )

    def queueing_measured(self, devices: int, nodes: int = 1) -> bool:
        """Whether the link of `devices` ranks on `nodes` nodes already holds their queueing
        for cores (one node, gloo above its cores, with counts there calibrated): then the
        contention model must not stretch the collective again."""
        over = self.oversubscribed
        return over is not None and nodes == 1 and devices > over.cores

    def law_extrapolated(self, devices: int, nodes: int = 1) -> int | None:
        """The widest calibrated count above the cores where `devices` ranks on one node take
        their link from the oversubscribed law beyond it, else None."""
        over = self.oversubscribed
        if over is None or nodes != 1 or devices <= max(over.cores, *over.measured):
            return None
        return max(over.measured)

    def held(self) -> CommModel:
        """This model with the oversubscribed link held at its widest calibration
        (`Oversubscribed.held`)."""
        over = self.oversubscribed
        return self if over is None else replace(self, oversubscribed=over.held())

    def link(self, nodes: int, devices: int | None = None) -> tuple[Link | None, str]:
        """The link a collective over `devices` ranks on `nodes` nodes runs at, and a caveat
        when a stand-in."""
        if nodes > 1 and self.inter is not None:
            return self.inter, ""
        if nodes > 1 and self.intra is not None:
            return self.intra, (
                "spans nodes, but calibration.json has no inter-node alpha/bandwidth "
                "(inter_node_alpha_s, inter_node_bandwidth_Bps): the intra-node terms stand in "
                "and likely understate the communication"
            )
        over = self.oversubscribed
        if over is not None and devices is not None and devices > over.cores:
            return over.link(devices), ""
        if self.intra is None or devices is None or len(self.by_devices) < 2:
            return self.intra, ""
        if devices in self.by_devices:
            return self.by_devices[devices], ""
        return self._grown(devices), ""

    def _grown(self, devices: float) -> Link:
        """The intra-node link at `devices` by the growth law fitted over `by_devices`."""
        ref = self.calibrated_devices or max(self.by_devices)
        scale = max(2, devices) / ref
        return Link(
            self.intra.alpha_s * scale**self.alpha_exp,
            self.intra.bandwidth_Bps * scale ** (-self.bandwidth_exp),
            self.intra.scope,
        )


def comm_model(calibration: Calibration | None, host_cores: float | None = None) -> CommModel:
    """The links calibration.json describes (none without it), with the growth fitted over
    the device counts it measured.

    gloo's collectives are host work: a count with more ranks than the node's `host_cores`
    measured its ranks queueing for cores as much as its links. Such counts leave the growth
    fit within the cores (on this 2-core box keeping them in its power law put held-out 16
    ranks 40-50% too slow) and fit a law of their own (`Oversubscribed`), which the link at an
    uncalibrated count above the cores follows."""
    if calibration is None:
        return CommModel(None)
    intra = inter = None
    if calibration.has_comm_model:
        intra = Link(calibration.alpha_s, calibration.bandwidth_Bps, "intra-node")
    if calibration.has_inter_node_model:
        inter = Link(
            calibration.inter_node_alpha_s, calibration.inter_node_bandwidth_Bps, "inter-node"
        )
    by_devices = {
        q: Link(alpha, bandwidth, "intra-node")
        for q, (alpha, bandwidth) in calibration.by_devices.items()
    }
    devices, above = calibration.devices, {}
    if calibration.backend == "gloo" and host_cores and by_devices:
        within = {q: link for q, link in by_devices.items() if q <= host_cores}
        if within and len(within) < len(by_devices):
            above = {q: link for q, link in by_devices.items() if q > host_cores}
            by_devices, devices = within, max(within)
            intra = within[devices]
    if intra is None or len(by_devices) < 2:
        model = CommModel(
            intra,
            inter,
            calibration.backend,
            devices,
            reused_from=calibration.reused_from,
        )
    else:
        qs = sorted(by_devices)
        model = CommModel(
            intra,
            inter,
            calibration.backend,
            devices,
            by_devices,
            _slope([(q, by_devices[q].alpha_s) for q in qs]),
            _slope([(q, 1 / by_devices[q].bandwidth_Bps) for q in qs]),
            reused_from=calibration.reused_from,
        )
    if above and intra is not None:
        model = replace(model, oversubscribed=_fit_oversubscribed(model, host_cores, above))
    return model


def _fit_oversubscribed(model: CommModel, cores: float, above: dict[int, Link]) -> Oversubscribed:
    """The log law of alpha and power law of 1/B over the counts above `cores`, anchored at
    the within-cores link at the cores (least squares through the anchor, slopes >= 0)."""
    anchor = model._grown(cores) if len(model.by_devices) >= 2 else model.intra
    xs = [math.log(q / cores) for q in sorted(above)]
    alpha_rel = [above[q].alpha_s / anchor.alpha_s - 1 for q in sorted(above)]
    inv_b = [math.log(anchor.bandwidth_Bps / above[q].bandwidth_Bps) for q in sorted(above)]
    norm = sum(x * x for x in xs)
    alpha_log = max(0.0, sum(x * y for x, y in zip(xs, alpha_rel, strict=True)) / norm)
    bw = sum(x * y for x, y in zip(xs, inv_b, strict=True)) / norm
    bw = min(max(bw, GROWTH_RANGE[0]), GROWTH_RANGE[1])
    return Oversubscribed(cores, anchor, alpha_log, bw, dict(above))


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log y on log p (points with y > 0), within GROWTH_RANGE; 0 with
    fewer than two such points."""
    xy = [(math.log(p), math.log(y)) for p, y in points if y > 0]
    if len(xy) < 2:
        return 0.0
    mx = sum(x for x, _ in xy) / len(xy)
    my = sum(y for _, y in xy) / len(xy)
    var = sum((x - mx) ** 2 for x, _ in xy)
    slope = sum((x - mx) * (y - my) for x, y in xy) / var if var > 0 else 0.0
    return min(max(slope, GROWTH_RANGE[0]), GROWTH_RANGE[1])
