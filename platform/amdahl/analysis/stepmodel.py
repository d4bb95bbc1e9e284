"""A step-time model that predicts configurations the sweep did not measure: other device
counts, per-device batch sizes and node counts, from results.parquet plus calibration.json.

Per configuration family (every setting except the device count and the per-device batch):

    compute        T_c(b) = a_c + b_c * b                (weighted least squares, relative error)
                   x kappa on p > 1 devices               (measured contention, 1 if unknown)
    communication  T_n(p) = latency_steps * alpha + bytes(sync, p, options) / B
                   x theta                                (fitted per strategy, 1 if unknown)
    step           (T_c^gamma + T_n^gamma)^(1/gamma)      (Pollux's overlap exponent, 1..8)
    wall per step  step + data wait                       (the family's measured data wait)
    throughput     global batch / wall per step

Compute observations: 1-device trials and `sync: none` trials (their whole step minus data wait,
no communication), and multi-device trials of strategies whose exposed communication the harness
measures (`comm_s`, DDP-based: their step minus data wait minus `comm_s`). A family with no
compute observation of its own borrows its `sync: none` sibling's (scaled by the micro-steps).
kappa is fitted where a family has compute observations both at 1 device and at more (else its
`sync: none` sibling's, else 1): it carries hardware contention (shared cores, memory bandwidth)
that per-device compute suffers with more workers. gamma and theta are fitted together per sync
strategy over its measured multi-device trials (squared log error of the step, plus a small
penalty on log theta so that a strategy with few points stays near the calibrated collective),
else pooled over every strategy's, else 1 and 1. theta is what the strategy's communication
costs against the calibrated ring: the work the wire formula does not see (ZeRO's partition
broadcast inside the optimizer step, PowerSGD's factorisation, hook casts, per-bucket launch
costs, comm threads taking cores from compute where workers share them). Without it the model
can only ever shorten the calibrated cost (gamma >= 1), and on shared CPU cores every strategy
was predicted too fast.

alpha and B come from calibration.json (`alpha_s`, `bandwidth_Bps`, measured within a node by
`platform calibrate`). Where the file also has `inter_node_alpha_s` and `inter_node_bandwidth_Bps`
(put there by hand: `platform calibrate` does not measure across nodes), a prediction that spans
nodes uses those for every collective (a ring across nodes runs at its slowest link); without
them it uses the intra-node terms and says so. The bytes per optimizer step of each strategy are
in `comm_volume`; gradient bytes come from a row's `grad_bytes` when present, else
calibration.json's `grad_bytes_for(params)`; PowerSGD needs parameter shapes
(`param_shapes_by_params`, written by `platform calibrate`) and labels an estimate without them.

Data wait is not modelled: a prediction reuses the family's measured per-step data wait at the
same per-device batch (else its median over the family), which says nothing about input pipelines
at device counts or batch sizes far from the measured ones.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from amdahl import strategies
from amdahl.analysis.calibration import Calibration
from amdahl.analysis.compute import (
    NO_SYNC,
    SETTINGS,
    Config,
    cost_per_million,
    device_hours_per_million,
    scale_batch,
)

#: The settings that make a family: all but devices, the batch and the trial id.
FAMILY_SETTINGS = tuple(c for c in SETTINGS if c not in ("batch_size", "trial"))
GAMMA_RANGE = (1.0, 8.0)
THETA_RANGE = (0.25, 16.0)
#: Weight of (log theta)^2 in the overlap fit: small against a point's squared log error, enough
#: to pick theta near 1 where gamma and theta trade off on too few points.
THETA_PRIOR = 0.01
KAPPA_RANGE = (0.25, 4.0)
#: Strategies whose whole communication the harness's `comm_s` measures (DDP's all-reduce and
#: its hooks): their multi-device trials give compute observations. From the strategy table.
COMM_S_COVERS = frozenset(n for n, s in strategies.STRATEGIES.items() if s.comm_s_covers)
#: Strategies that never communicate (`none`, the ceiling), from the strategy table.
SILENT = frozenset(n for n, s in strategies.STRATEGIES.items() if not s.communicates)
#: Optional calibration.json keys for links across nodes (not measured by `platform calibrate`).
INTER_ALPHA_KEY = "inter_node_alpha_s"
INTER_BANDWIDTH_KEY = "inter_node_bandwidth_Bps"
#: calibration.json: per `params` JSON, the shapes of the model's trainable parameters.
SHAPES_KEY = "param_shapes_by_params"
#: torch's PowerSGDState default: a matrix is compressed only when that divides its size by more.
POWERSGD_MIN_COMPRESSION = 2
#: Every sync strategy the model knows: the strategy table's (a strategy added there without a
#: communication model here fails the test that checks every one has a volume).
STRATEGIES: tuple[str, ...] = strategies.NAMES


def communicates(sync: str, devices: int) -> bool:
    """Whether `sync` moves data on `devices` ranks (the strategy table's `communicates` and
    `communicates_alone`); a name the table lacks is taken as one that communicates on p > 1."""
    strategy = strategies.STRATEGIES.get(sync)
    if strategy is None:
        return devices > 1
    return strategy.communicates and (devices > 1 or strategy.communicates_alone)


# --------------------------------------------------------------------------- communication


@dataclass(frozen=True)
class SyncOptions:
    """The sweep's `options` that set how much a strategy communicates."""

    bucket_cap_mb: float = strategies.OPTION_DEFAULTS["bucket_cap_mb"]
    powersgd_rank: int = strategies.OPTION_DEFAULTS["powersgd_rank"]
    accumulate_steps: int = strategies.OPTION_DEFAULTS["accumulate_steps"]
    local_sgd_every: int = strategies.OPTION_DEFAULTS["local_sgd_every"]
    ps_shards: int = strategies.OPTION_DEFAULTS["ps_shards"]

    @classmethod
    def from_spec(cls, spec: Any) -> SyncOptions:
        """From a spec.yaml mapping (its `options` section); defaults where absent or odd."""
        raw = (spec.get("options") if isinstance(spec, dict) else None) or {}
        kwargs = {}
        for name in cls.__dataclass_fields__:
            v = raw.get(name) if isinstance(raw, dict) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                kwargs[name] = type(getattr(cls, name))(v)
        return cls(**kwargs)


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


def ddp_buckets(grad_bytes: float, options: SyncOptions) -> int:
    """DDP's gradient buckets, each one all-reduce: ceil(gradient bytes / bucket_cap_mb)."""
    return max(1, math.ceil(grad_bytes / (options.bucket_cap_mb * 2**20)))


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
    options: SyncOptions | None = None,
    shapes: list[list[int]] | None = None,
) -> CommVolume | None:
    """Bytes and latency terms per optimizer step of a sync strategy on `devices` ranks, for a
    model with `grad_bytes` of fp32 gradients; None for a strategy the model does not know.

    Ring collectives: an all-reduce moves 2(p-1)/p x n bytes per rank in 2(p-1) latency steps,
    a reduce-scatter or all-gather (p-1)/p x n in (p-1). DDP all-reduces per bucket
    (`ddp_buckets`), each bucket paying the latency.

    - strategies with a `wire_factor` in the table (ddp, accumulate, ddp_fp16, ddp_bf16): one
      all-reduce of the gradient per optimizer step (accumulate: after the last of its
      micro-steps) at wire_factor of its bytes (the 2-byte hooks: half);
    - powersgd: per bucket, three all-reduces (the uncompressed tensors, the P and the Q
      factors) of `powersgd_elements`; without shapes the gradient is taken as one square
      matrix (an estimate, labelled);
    - zero1 as sync.py builds it: DDP's gradient all-reduce, then ZeroRedundancyOptimizer
      broadcasts each rank's updated partition, (p-1)/p x n more bytes per rank, 3(p-1)/p in
      all (a ZeRO-1 that reduce-scatters instead would move 2(p-1)/p);
    - fsdp: all-gather (forward) + all-gather (backward) + reduce-scatter, 3(p-1)/p x n, one
      latency term per collective (FSDP units are not counted);
    - param_server: each worker pushes its gradient and pulls the parameters once per step;
      each of the `ps_shards` shards serves all p workers, so the busiest link carries
      2 n max(1, p / shards) bytes, with one round trip (2 latency terms); the calibrated
      collective's alpha and B stand in for Ray's object transfer (rough). It communicates
      with one device too;
    - local_sgd: one all-reduce of the parameters (as many bytes as the gradient) every
      `local_sgd_every` steps, amortised per step;
    - none: nothing.
    """
    options = options or SyncOptions()
    p = max(1, int(devices))
    g = float(grad_bytes)
    ring = 2 * (p - 1) / p
    half = (p - 1) / p
    buckets = ddp_buckets(g, options)
    if sync not in STRATEGIES:
        return None
    if not communicates(sync, p):
        return CommVolume(0.0, 0.0, "no communication")
    if sync == "param_server":
        shards = max(1, options.ps_shards)
        return CommVolume(
            2 * g * max(1.0, p / shards),
            2.0,
            f"push + pull of the gradient through {shards} parameter-server shard(s)",
        )
    wire = strategies.STRATEGIES[sync].wire_factor
    if wire is not None:  # DDP and its compression hooks: the table's bytes per gradient byte
        as_sent = "" if wire == 1 else f" at {wire:g} of its bytes"
        return CommVolume(
            ring * g * wire,
            2 * (p - 1) * buckets,
            f"ring all-reduce of the gradient{as_sent} ({buckets} bucket(s))",
        )
    if sync == "powersgd":
        r = max(1, options.powersgd_rank)
        estimate = ""
        if shapes:
            sent, total = powersgd_elements(shapes, r)
        else:
            total = g / 4
            sent, total = powersgd_elements([[round(math.sqrt(total))] * 2], r)
            estimate = (
                "no parameter shapes in calibration.json: the gradient taken as one square "
                "matrix (run `platform calibrate` again to record the shapes)"
            )
        wire = g * sent / total if total else 0.0
        return CommVolume(
            ring * wire,
            3 * 2 * (p - 1) * buckets,
            f"ring all-reduce of rank-{r} factors ({sent / total:.1%} of the gradient)"
            if total
            else "ring all-reduce of rank-r factors",
            estimate,
        )
    if sync == "zero1":
        return CommVolume(
            ring * g + half * g,
            2 * (p - 1) * buckets + (p - 1),
            "gradient all-reduce + partition broadcasts (3(p-1)/p of the gradient)",
        )
    if sync == "fsdp":
        return CommVolume(
            3 * half * g, 3 * (p - 1), "all-gather x2 + reduce-scatter (3(p-1)/p of the gradient)"
        )
    if sync == "local_sgd":
        every = max(1, options.local_sgd_every)
        return CommVolume(
            ring * g / every,
            2 * (p - 1) / every,
            f"ring all-reduce of the parameters every {every} steps",
        )
    raise AssertionError(sync)  # every strategy in STRATEGIES is handled above


@dataclass(frozen=True)
class CommModel:
    """The calibrated links: within a node (calibration.json's alpha_s, bandwidth_Bps) and,
    when given, across nodes."""

    intra: Link | None
    inter: Link | None = None
    backend: str = ""
    calibrated_devices: int | None = None

    def link(self, nodes: int) -> tuple[Link | None, str]:
        """The link a collective over `nodes` nodes runs at, and a caveat when a stand-in."""
        if nodes > 1 and self.inter is not None:
            return self.inter, ""
        if nodes > 1 and self.intra is not None:
            return self.intra, (
                "spans nodes, but calibration.json has no inter-node alpha/bandwidth "
                f"({INTER_ALPHA_KEY}, {INTER_BANDWIDTH_KEY}): the intra-node terms stand in "
                "and likely understate the communication"
            )
        return self.intra, ""


def comm_model(calibration: Calibration | None, raw: dict[str, Any] | None = None) -> CommModel:
    raw = raw or {}
    intra = None
    if calibration is not None and calibration.has_comm_model:
        intra = Link(calibration.alpha_s, calibration.bandwidth_Bps, "intra-node")
    inter = None
    a, bw = raw.get(INTER_ALPHA_KEY), raw.get(INTER_BANDWIDTH_KEY)
    if _num(a) and a >= 0 and _num(bw) and bw > 0:
        inter = Link(float(a), float(bw), "inter-node")
    return CommModel(
        intra,
        inter,
        calibration.backend if calibration else "",
        calibration.devices if calibration else None,
    )


# --------------------------------------------------------------------------- measured points


@dataclass(frozen=True)
class Point:
    """One measured configuration as the model sees it (medians over its ok repeats)."""

    config: Config
    family: tuple
    devices: int
    batch: float  # per device
    micro: float
    global_batch: float
    throughput: float
    busy_s: float  # seconds per step without data wait
    data_wait_s: float | None
    compute_s: float | None  # a compute observation, when this trial gives one
    nodes: int


def family_key(settings: dict[str, Any]) -> tuple:
    return tuple(settings.get(c) for c in FAMILY_SETTINGS)


def measured_point(c: Config) -> Point | None:
    if not c.ok or not c.batch_size or c.step_wall is None or c.throughput is None:
        return None
    wall = c.step_wall.median
    dw = c.stat("data_wait_s")
    wait = dw.median if dw else None
    busy = wall - (wait or 0.0)
    if busy <= 0:
        return None
    micro_stat = c.stat("micro_steps")
    micro = micro_stat.median if micro_stat else 1.0
    gb = c.stat("global_batch")
    p = c.devices
    compute = None
    if not communicates(c.sync, p):
        compute = busy
    elif c.sync in COMM_S_COVERS:
        comm = c.stat("comm_s")
        if comm is not None and busy - comm.median > 0:
            compute = busy - comm.median
    return Point(
        config=c,
        family=family_key(c.settings),
        devices=p,
        batch=float(c.batch_size),
        micro=micro,
        global_batch=gb.median if gb else c.batch_size * p * micro,
        throughput=c.throughput.median,
        busy_s=busy,
        data_wait_s=wait,
        compute_s=compute,
        nodes=_nodes(c),
    )


def _nodes(c: Config) -> int:
    counts = []
    for r in c.ok_rows:
        try:
            ids = json.loads(r.get("nodes") or "[]")
        except ValueError:
            continue
        if isinstance(ids, list) and ids:
            counts.append(len({str(i) for i in ids}))
    return int(statistics.median(counts)) if counts else 1


# --------------------------------------------------------------------------- fitting


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

    @property
    def sync(self) -> str:
        return self.settings.get("sync") or ""

    @property
    def scaling(self) -> str:
        return self.settings.get("scaling") or "weak"

    @property
    def has_compute(self) -> bool:
        return self.a_c is not None and self.b_c is not None

    def compute_s(self, batch: float, devices: int) -> float | None:
        if not self.has_compute:
            return None
        t = self.a_c + self.b_c * batch
        return t * (self.kappa if devices > 1 else 1.0)

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


@dataclass
class StepModel:
    families: dict[tuple, Family]
    comm: CommModel
    options: SyncOptions
    #: sync -> (gamma, theta, points)
    overlaps: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    pooled_overlap: tuple[float, float, int] | None = None

    def family_of(self, c: Config) -> Family | None:
        return self.families.get(family_key(c.settings))

    def predict(self, family: Family, devices: int, batch: float, nodes: int = 1) -> Prediction:
        p, nodes = max(1, int(devices)), max(1, int(nodes))
        compute = family.compute_s(batch, p)
        if compute is None:
            why = "no compute measurement in this family or its sync none sibling"
            return Prediction(p, batch, nodes, unknown=why)
        caveats: list[str] = []
        volume = None
        link = None
        comm = 0.0
        if family.sync not in STRATEGIES:
            return Prediction(p, batch, nodes, compute, unknown=f"unknown sync {family.sync!r}")
        if communicates(family.sync, p):
            link, caveat = self.comm.link(nodes)
            if link is None:
                return Prediction(
                    p,
                    batch,
                    nodes,
                    compute,
                    unknown="no communication model: no calibration.json with alpha and "
                    "bandwidth (run `platform calibrate DIR --devices N`)",
                )
            if not family.grad_bytes:
                return Prediction(
                    p,
                    batch,
                    nodes,
                    compute,
                    unknown="gradient bytes unknown (not in calibration.json: run "
                    "`platform calibrate` with the sweep's spec.yaml in DIR)",
                )
            if caveat:
                caveats.append(caveat)
            volume = comm_volume(family.sync, p, family.grad_bytes, self.options, family.shapes)
            if volume.estimate:
                caveats.append(volume.estimate)
            comm = volume.seconds(link) * family.theta
        step = combine(compute, comm, family.gamma)
        wait, how = family.data_wait_s(batch)
        if how != "measured at this batch":
            caveats.append(f"data wait {how}")
        gb = batch * p * family.micro
        return Prediction(
            p,
            batch,
            nodes,
            compute,
            comm,
            wait,
            step,
            gb / (step + wait),
            volume,
            link,
            caveats=tuple(caveats),
        )


def combine(compute: float, comm: float, gamma: float) -> float:
    """(T_c^gamma + T_n^gamma)^(1/gamma): gamma 1 adds them (no overlap), large gamma tends to
    the larger of the two (full overlap). Scaled by the larger term to stay in range."""
    m = max(compute, comm)
    if m <= 0:
        return 0.0
    return m * ((compute / m) ** gamma + (comm / m) ** gamma) ** (1.0 / gamma)


@dataclass
class ModelInputs:
    """What the model is fitted from: the sweep's configurations, calibration and options."""

    configs: list[Config]
    calibration: Calibration | None = None
    options: SyncOptions = field(default_factory=SyncOptions)
    calibration_raw: dict[str, Any] = field(default_factory=dict)
    price: float = 0.0
    name: str = "sweep"
    notes: list[str] = field(default_factory=list)

    def points(self) -> list[Point]:
        return [pt for c in self.configs if (pt := measured_point(c)) is not None]


def fit(inputs: ModelInputs, points: list[Point] | None = None) -> StepModel:
    """Fit every family's compute line, kappa and gamma from `points` (default: all measured)."""
    points = inputs.points() if points is None else points
    comm = comm_model(inputs.calibration, inputs.calibration_raw)
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
        if sibling is None or sibling is fam:
            continue
        if not fam.has_compute and sibling.has_compute:
            scale = fam.micro / (sibling.micro or 1.0)
            fam.a_c, fam.b_c = sibling.a_c * scale, sibling.b_c * scale
            fam.compute_source = f"borrowed from sync none ({sibling.compute_source})"
            fam.kappa, fam.kappa_source = sibling.kappa, f"sync none's: {sibling.kappa_source}"
        elif fam.kappa_source.startswith("default") and not sibling.kappa_source.startswith(
            "default"
        ):
            fam.kappa = sibling.kappa
            fam.kappa_source = f"sync none's: {sibling.kappa_source}"
    _fit_overlaps(model, points)
    return model


def _new_family(key: tuple, c: Config, inputs: ModelInputs) -> Family:
    settings = dict(zip(FAMILY_SETTINGS, key, strict=True))
    label = " ".join(c.label.split(" ")[2:])
    fam = Family(key=key, label=label, settings=settings)
    grads = [r.get("grad_bytes") for r in c.rows if _num(r.get("grad_bytes"))]
    fam.grad_bytes = grads[0] if grads else None
    if fam.grad_bytes is None and inputs.calibration is not None:
        fam.grad_bytes = inputs.calibration.grad_bytes_for(settings.get("params"))
    shapes = inputs.calibration_raw.get(SHAPES_KEY)
    if isinstance(shapes, dict):
        chosen = shapes.get(settings.get("params"))
        if chosen is None and len(shapes) == 1:
            chosen = next(iter(shapes.values()))
        if _shape_list(chosen):
            fam.shapes = chosen
    known = fam.sync in strategies.STRATEGIES
    fam.micro = float(strategies.micro_steps(fam.sync, asdict(inputs.options)) if known else 1)
    return fam


def _shape_list(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in v
    )


def _fit_compute(fam: Family, points: list[Point]) -> None:
    if points:
        fam.micro = statistics.median(pt.micro for pt in points)
    obs = [(pt.batch, pt.compute_s, pt.devices > 1) for pt in points if pt.compute_s]
    fam.compute_points = len(obs)
    if not obs:
        return
    one = [o for o in obs if not o[2]]
    many = [o for o in obs if o[2]]
    if one and many:
        fam.kappa = _fit_kappa(tuple(obs))
        fam.kappa_source = (
            f"fitted: {len(many)} multi-device against {len(one)} 1-device compute point(s)"
        )
    a, b, _ = _line_fit(obs, fam.kappa)
    fam.a_c, fam.b_c = a, b
    parts = []
    if one:
        parts.append(f"{len(one)} 1-device or sync none point(s)")
    if many:
        parts.append(f"{len(many)} multi-device point(s)")
    fam.compute_source = " + ".join(parts)
    if len({o[0] for o in obs}) < 2:
        fam.notes.append("compute measured at one batch size only: taken proportional to it")


@functools.lru_cache(maxsize=1024)
def _fit_kappa(obs: tuple[tuple[float, float, bool], ...]) -> float:
    """Cached: a leave-one-out refit sees the same observations in every family but one."""
    return _minimize(lambda k: _line_fit(obs, k)[2], *KAPPA_RANGE, log=True)


def _line_fit(
    obs: tuple[tuple[float, float, bool], ...] | list[tuple[float, float, bool]], kappa: float
) -> tuple[float, float, float]:
    """T = a + b x (x kappa for multi-device observations) by least squares on relative error,
    a >= 0 and b >= 0; returns (a, b, sum of squared relative errors)."""
    xs = [x for x, _, _ in obs]
    ys = [t / (kappa if multi else 1.0) for _, t, multi in obs]
    ws = [1.0 / (y * y) for y in ys]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs, strict=True))
    sy = sum(w * y for w, y in zip(ws, ys, strict=True))
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
    det = sw * sxx - sx * sx
    if det > 1e-12 * sw * sxx:
        b = (sw * sxy - sx * sy) / det
        a = (sy - b * sx) / sw
    else:
        a, b = 0.0, sxy / sxx
    if a < 0:
        a, b = 0.0, sxy / sxx
    if b < 0:
        a, b = sy / sw, 0.0
    sse = sum(((a + b * x) / y - 1.0) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, sse


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
    pairs: dict[str, list[tuple[float, float, float]]] = {}
    for pt in points:
        fam = model.families.get(pt.family)
        if fam is None or pt.devices <= 1 or fam.sync in SILENT or not fam.sync:
            continue
        compute = fam.compute_s(pt.batch, pt.devices)
        link, _ = model.comm.link(pt.nodes)
        if compute is None or link is None or not fam.grad_bytes:
            continue
        volume = comm_volume(fam.sync, pt.devices, fam.grad_bytes, model.options, fam.shapes)
        comm = volume.seconds(link) if volume else 0.0
        if comm > 0:
            pairs.setdefault(fam.sync, []).append((compute, comm, pt.busy_s))
    model.overlaps = {sync: (*_fit_overlap(tuple(obs)), len(obs)) for sync, obs in pairs.items()}
    everything = tuple(o for obs in pairs.values() for o in obs)
    needed = any(
        f.sync not in model.overlaps and f.sync not in SILENT for f in model.families.values()
    )
    if everything and needed:
        model.pooled_overlap = (*_fit_overlap(everything), len(everything))
    for fam in model.families.values():
        if fam.sync in SILENT:
            fam.gamma_source = "not used: no communication"
        elif fam.sync in model.overlaps:
            fam.gamma, fam.theta, n = model.overlaps[fam.sync]
            fam.gamma_source = f"gamma and theta fitted over {n} multi-device {fam.sync} point(s)"
        elif model.pooled_overlap:
            fam.gamma, fam.theta, n = model.pooled_overlap
            fam.gamma_source = (
                f"gamma and theta pooled over {n} multi-device point(s) of other strategies"
            )


@functools.lru_cache(maxsize=1024)
def _fit_overlap(obs: tuple[tuple[float, float, float], ...]) -> tuple[float, float]:
    """(gamma, theta) for observations (compute, calibrated comm, measured busy step).
    Cached: a leave-one-out refit changes the observations of one strategy only."""

    def sse(gamma: float, theta: float) -> float:
        return sum(math.log(combine(c, theta * n, gamma) / t) ** 2 for c, n, t in obs)

    def best_gamma(theta: float) -> float:
        return _minimize(lambda g: sse(g, theta), *GAMMA_RANGE)

    def cost(theta: float) -> float:
        return sse(best_gamma(theta), theta) + THETA_PRIOR * math.log(theta) ** 2

    theta = _minimize(cost, *THETA_RANGE, log=True)
    return best_gamma(theta), theta


def _minimize(f: Callable[[float], float], lo: float, hi: float, log: bool = False) -> float:
    """Coarse grid (29 points, log-spaced with `log`), then golden section around the best."""
    to = math.log if log else (lambda v: v)
    back = math.exp if log else (lambda v: v)
    a0, b0 = to(lo), to(hi)
    n = 28
    xs = [a0 + (b0 - a0) * i / n for i in range(n + 1)]
    vals = [f(back(x)) for x in xs]
    i = min(range(n + 1), key=vals.__getitem__)
    a, b = xs[max(i - 1, 0)], xs[min(i + 1, n)]
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(back(c)), f(back(d))
    for _ in range(30):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(back(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(back(d))
    x = (a + b) / 2
    return back(x) if f(back(x)) <= vals[i] else back(xs[i])


# --------------------------------------------------------------------------- leave one out


@dataclass(frozen=True)
class LooPoint:
    """A measured configuration against the model refitted without it."""

    config: Config
    measured: float  # samples/s
    predicted: float | None
    unknown: str = ""

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.predicted is None or not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


def leave_one_out(inputs: ModelInputs, min_devices: int = 2) -> list[LooPoint]:
    """For each measured point on `min_devices` or more devices: refit without it, predict it."""
    points = inputs.points()
    out = []
    for i, pt in enumerate(points):
        if pt.devices < min_devices:
            continue
        model = fit(inputs, points[:i] + points[i + 1 :])
        fam = model.families[pt.family]
        pred = model.predict(fam, pt.devices, pt.batch, pt.nodes)
        out.append(LooPoint(pt.config, pt.throughput, pred.throughput, pred.unknown))
    return out


def error_summary(loo: list[LooPoint], min_devices: int = 2) -> tuple[float, float, int] | None:
    """(median, p90 of |relative error|, points) over LOO points on >= min_devices devices."""
    errs = sorted(
        abs(p.error) for p in loo if p.error is not None and p.config.devices >= min_devices
    )
    if not errs:
        return None
    return statistics.median(errs), _quantile(errs, 0.9), len(errs)


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks."""
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


# --------------------------------------------------------------------------- sweep predictions


@dataclass(frozen=True)
class PredictedRow:
    """A family at one device count and batch (the grid's meaning: per device under weak
    scaling, global under strong), against its 1-device throughput."""

    devices: int
    batch: int
    prediction: Prediction
    baseline: float | None = None  # 1-device samples/s at the same batch
    baseline_measured: bool = False
    price: float = 0.0

    @property
    def speedup(self) -> float | None:
        x = self.prediction.throughput
        return x / self.baseline if x and self.baseline else None

    @property
    def efficiency(self) -> float | None:
        s = self.speedup
        return s / self.devices if s is not None else None

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


@dataclass
class SweepPrediction:
    name: str
    model: StepModel
    families: list[FamilyPrediction]
    loo: list[LooPoint]
    price: float
    nodes: int
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> tuple[float, float, int] | None:
        return error_summary(self.loo)


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
    if model.comm.intra is None:
        out.notes.append(
            "no calibration.json with alpha and bandwidth: no communication model, so only "
            "sync none (no communication) can be predicted; run `platform calibrate DIR "
            "--devices N` first"
        )
    for key, fam in model.families.items():
        configs = by_family.get(key, [])
        batches = batch_sizes or sorted(
            {scale_batch(c.settings) for c in configs if c.ok and c.batch_size}
        )
        rows = []
        for b in batches:
            one = next(
                (
                    measured[c.key]
                    for c in configs
                    if c.devices == 1 and scale_batch(c.settings) == b and c.key in measured
                ),
                None,
            )
            base_pred = model.predict(fam, 1, float(b), 1)
            baseline = one.throughput if one else base_pred.throughput
            for p in devices:
                per_device = b / p if fam.scaling == "strong" else float(b)
                pred = model.predict(fam, p, per_device, nodes)
                rows.append(PredictedRow(p, b, pred, baseline, one is not None, inputs.price))
        out.families.append(FamilyPrediction(fam, rows))
    return out


def project_curve(
    model: StepModel, last: Config, baseline: Config | None, devices: list[int]
) -> list[PredictedRow]:
    """A measured curve (the family and batch of `last`, its largest measured configuration)
    predicted at more devices, against its measured 1-device `baseline` (else the model's)."""
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
        pred = model.predict(fam, p, per_device, _nodes(last))
        out.append(PredictedRow(p, b, pred, base, baseline is not None))
    return out


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
