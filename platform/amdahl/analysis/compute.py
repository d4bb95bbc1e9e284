"""The report's numbers: pure functions over results rows, each formula cited where it is used.

- Speedup (docs/architecture.md): weak scaling (fixed per-device batch) S(p) = X(p) / X(1), the
  throughput ratio; strong scaling (fixed global batch) S(p) = T(1) / T(p), the ratio of seconds
  per optimizer step. Ideal S = p; efficiency E = S / p.
- Two ideals per curve: linear (p * X(1)) and the measured no-communication ceiling, the same
  settings with sync "none" (every worker trains alone). E = (C/p) * (S/C) splits the gap into
  hardware contention (C/p) and communication (S/C).
- Amdahl: S(p) = 1 / (s + (1 - s) / p); Karp-Flatt e = (1/S - 1/p) / (1 - 1/p).
- Ring all-reduce: t = 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth (nccl-tests PERFORMANCE.md);
  bus bandwidth = bytes / t * 2(p-1)/p.
- MFU = achieved FLOP/s / (p * peak FLOP/s per device).

Every figure is a `Stat` over a configuration's repeats, so every number keeps its spread.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from amdahl.columns import SETTING_COLUMNS

#: What rows were measured under besides their axis values, set apart only where a sweep
#: directory holds rows of the same axis values measured under different settings (one resumed
#: with other settings, before `platform sweep --resume` refused that), so that those are never
#: taken for repeats of one configuration; None everywhere else. See `_measured_under`.
MEASURED_UNDER = ("steps", "warmup_steps", "target", "trial")
#: Columns that, with `devices`, identify one configuration.
SETTINGS = (
    "workload",
    "params",
    "scaling",
    "batch_size",
    *(c for c in SETTING_COLUMNS if c != "devices"),
    *MEASURED_UNDER,
)
#: The no-communication ceiling's sync value.
NO_SYNC = "none"
#: Device-count multiples of the largest measured count that the Amdahl fit projects to.
PROJECTION_FACTORS = (2, 4, 8)


# --------------------------------------------------------------------------- figures with spread


@dataclass(frozen=True)
class Stat:
    """A figure over repeats: median, range (lo..hi), count, coefficient of variation."""

    median: float
    lo: float
    hi: float
    n: int
    cv: float = 0.0

    @classmethod
    def of(cls, values: Iterable[Any]) -> Stat | None:
        """From raw values; None, NaN and inf are skipped; None when nothing is left."""
        xs = [float(v) for v in values if _finite(v)]
        if not xs:
            return None
        mean = statistics.fmean(xs)
        cv = statistics.stdev(xs) / abs(mean) if len(xs) > 1 and mean else 0.0
        return cls(statistics.median(xs), min(xs), max(xs), len(xs), cv)

    @property
    def spread(self) -> float:
        """max - min over the repeats (0 with one repeat: unknown, not zero noise)."""
        return self.hi - self.lo

    @property
    def rel_spread(self) -> float:
        return self.spread / abs(self.median) if self.median else 0.0

    def scale(self, k: float) -> Stat:
        lo, hi = sorted((self.lo * k, self.hi * k))
        return Stat(self.median * k, lo, hi, self.n, self.cv)

    def inverse(self) -> Stat:
        """1/x, with the range flipped (lo of 1/x comes from hi of x)."""
        return Stat(1 / self.median, 1 / self.hi, 1 / self.lo, self.n, self.cv)


def ratio(a: Stat, b: Stat) -> Stat:
    """a / b with its worst-case range: lo = a.lo / b.hi, hi = a.hi / b.lo."""
    return Stat(
        a.median / b.median,
        a.lo / b.hi,
        a.hi / b.lo,
        min(a.n, b.n),
        math.hypot(a.cv, b.cv),
    )


def differs(a: Stat, b: Stat) -> bool:
    """True when the medians differ by more than the larger spread; otherwise the report says
    "no measurable difference". With one repeat each, the spread is 0 and any difference counts
    (the report says so)."""
    return abs(a.median - b.median) > max(a.spread, b.spread)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --------------------------------------------------------------------------- configurations


@dataclass
class Config:
    """One point of the grid (all settings including devices) and its repeats."""

    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""

    @property
    def key(self) -> tuple:
        return tuple(self.settings[c] for c in (*SETTINGS, "devices"))

    @property
    def ok_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") == "ok" and _finite(r.get("throughput"))]

    @property
    def ok(self) -> bool:
        return bool(self.ok_rows)

    @property
    def devices(self) -> int:
        return int(self.settings["devices"] or 1)

    @property
    def batch_size(self) -> int | None:
        return self.settings["batch_size"]

    @property
    def sync(self) -> str:
        return self.settings["sync"] or ""

    @property
    def scaling(self) -> str:
        return self.settings["scaling"] or "weak"

    @property
    def device_type(self) -> str:
        names = {r.get("device_name") for r in self.rows if r.get("device_name")}
        return "cpu" if not names or names == {"cpu"} else "cuda"

    def stat(self, metric: str) -> Stat | None:
        return Stat.of(r.get(metric) for r in self.ok_rows)

    @property
    def throughput(self) -> Stat | None:
        return self.stat("throughput")

    @property
    def step_wall(self) -> Stat | None:
        """Seconds per optimizer step as the measured window saw them (data wait, loop overhead
        and the slowest rank included): measured_s / steps, else global batch / throughput."""
        return Stat.of(_step_wall(r) for r in self.ok_rows)

    @property
    def perf(self) -> Stat | None:
        """What speedup is a ratio of: throughput (weak) or 1 / seconds per step (strong)."""
        if self.scaling == "strong":
            wall = self.step_wall
            return wall.inverse() if wall and wall.lo > 0 else None
        return self.throughput

    @property
    def curve_key(self) -> tuple:
        """Settings without devices; the batch that stays fixed along the curve is per device
        (weak) or global (strong)."""
        s = dict(self.settings)
        s["batch_size"] = scale_batch(s)
        return tuple(s[c] for c in SETTINGS)


def _step_wall(row: dict[str, Any]) -> float | None:
    if _finite(row.get("measured_s")) and row.get("steps"):
        return row["measured_s"] / row["steps"]
    if _finite(row.get("throughput")) and row["throughput"] > 0 and row.get("global_batch"):
        return row["global_batch"] / row["throughput"]
    if _finite(row.get("step_time_s")):
        return row["step_time_s"] + (row.get("data_wait_s") or 0.0)
    return None


def scale_batch(settings: dict[str, Any]) -> int | None:
    """The batch that stays fixed as devices grow: per device (weak), global (strong)."""
    b = settings.get("batch_size")
    if b is None or settings.get("scaling") != "strong":
        return b
    return b * int(settings.get("devices") or 1)


def group_configs(rows: list[dict[str, Any]]) -> list[Config]:
    """Rows (repeats, any status) grouped into configurations, in a stable order: repeats share
    their axis values and what they were measured under (`_measured_under`)."""
    groups: dict[tuple, Config] = {}
    for row, measured in zip(rows, _measured_under(rows), strict=True):
        settings = {**_axis_settings(row), **measured}
        key = tuple(settings[c] for c in (*SETTINGS, "devices"))
        groups.setdefault(key, Config(settings=settings)).rows.append(row)
    configs = sorted(groups.values(), key=_order)
    varying = _varying_params(configs)
    for c in configs:
        c.label = config_label(c.settings, varying)
    return configs


def _axis_settings(row: dict[str, Any]) -> dict[str, Any]:
    settings = {c: row.get(c) for c in (*SETTINGS, "devices") if c not in MEASURED_UNDER}
    settings["scaling"] = settings["scaling"] or "weak"
    return settings


def _measured_under(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row, the MEASURED_UNDER values that tell it apart from rows of the same axis values
    measured under other settings.

    - The training length: `steps` (in time-to-target mode the `target` instead, as the steps
      run then differ by repeat) and `warmup_steps`; each is None unless the ok rows disagree
      on it. A row lacking them (a launch that crashed records no target) takes its trial's.
    - `trial`: the trial id, which hashes every setting that changes a measurement (lr, seed,
      optimizer, resources, options, ...), where rows of the same axis values and length
      still come from several trials; else None.

    In a directory measured under one set of settings all of these are None: keys, labels and
    comparisons between directories are unchanged.
    """
    by_trial: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        by_trial.setdefault(r.get("trial_id"), []).append(r)

    def own_or_trials(r: dict[str, Any], column: str) -> Any:
        if r.get(column) is not None:
            return r[column]
        same_trial = by_trial[r.get("trial_id")]
        return next((o[column] for o in same_trial if o.get(column) is not None), None)

    out = []
    for r in rows:
        target = own_or_trials(r, "target")
        out.append(
            {
                "steps": None if target else r.get("steps"),
                "warmup_steps": own_or_trials(r, "warmup_steps"),
                "target": target,
            }
        )
    ok = [m for r, m in zip(rows, out, strict=True) if r.get("status") == "ok"]
    for column in ("steps", "warmup_steps", "target"):
        if len({m[column] for m in ok}) <= 1:
            for m in out:
                m[column] = None
    keys = [
        (tuple(_axis_settings(r).values()), tuple(m.values()))
        for r, m in zip(rows, out, strict=True)
    ]
    trials: dict[tuple, set[Any]] = {}
    for r, key in zip(rows, keys, strict=True):
        trials.setdefault(key, set()).add(r.get("trial_id"))
    for r, m, key in zip(rows, out, keys, strict=True):
        m["trial"] = r.get("trial_id") if len(trials[key]) > 1 else None
    return out


def _order(c: Config) -> tuple:
    s = c.settings
    return (
        str(s["workload"]),
        str(s["params"]),
        str(s["precision"]),
        str(s["compile"]),
        s["data_workers"] or 0,
        s["sync"] == NO_SYNC,
        str(s["sync"]),
        scale_batch(s) or 0,
        c.devices,
    )


def _varying_params(configs: list[Config]) -> list[str]:
    """Workload parameters that differ between configurations (only those go into labels)."""
    parsed = [_params(c.settings["params"]) for c in configs]
    keys = sorted({k for p in parsed for k in p})
    return [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in parsed}) > 1]


def _params(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def config_label(settings: dict[str, Any], varying_params: list[str] = ()) -> str:
    """Short label like the plan's: `d2 b256 fp32 eager w1 ddp` (strong: `gb512` = global)."""
    s = settings
    if s.get("scaling") == "strong" and s.get("batch_size") is not None:
        batch = f"gb{scale_batch(s)}"
    else:
        batch = f"b{s.get('batch_size')}"
    parts = [
        f"d{s.get('devices')}",
        batch,
        str(s.get("precision")),
        str(s.get("compile")),
        f"w{s.get('data_workers')}",
        str(s.get("sync")),
    ]
    if s.get("input") not in (None, "ray_data"):  # as the plan labels them: defaults unsaid
        parts.append(str(s["input"]))
    if s.get("prefetch_batches") not in (None, 4):
        parts.append(f"p{s['prefetch_batches']}")
    params = _params(s.get("params"))
    parts += [f"{k}={json.dumps(params.get(k), separators=(',', ':'))}" for k in varying_params]
    # Set only where rows of equal axis values were measured under other settings.
    for column, name in (("steps", "steps"), ("warmup_steps", "warmup"), ("trial", "trial")):
        if s.get(column) is not None:
            parts.append(f"{name}={s[column]}")
    if s.get("target") is not None:
        parts.append(str(s["target"]))
    return " ".join(parts)


# --------------------------------------------------------------------------- scaling curves


def amdahl_speedup(s: float, p: float) -> float:
    """Amdahl's law: the most p devices can give when a fraction s of the work is serial."""
    return 1.0 / (s + (1.0 - s) / p)


def karp_flatt(speedup: float, p: int) -> float | None:
    """Experimentally determined serial fraction e = (1/S - 1/p) / (1 - 1/p) (Karp & Flatt 1990);
    undefined at p = 1. A growing e with p means overhead that grows with p (communication)."""
    if p <= 1 or speedup <= 0:
        return None
    return (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)


@dataclass(frozen=True)
class AmdahlFit:
    """Least-squares fit of S(p) = 1 / (s + (1 - s)/p) to measured speedups, s in [0, 1]."""

    serial_fraction: float
    rmse: float
    r2: float | None  # None with fewer than two points beyond p = 1 (no degrees of freedom)
    points: int

    def speedup(self, p: float) -> float:
        return amdahl_speedup(self.serial_fraction, p)

    @property
    def limit(self) -> float:
        """1/s: the speedup no number of devices can pass."""
        return math.inf if self.serial_fraction <= 0 else 1.0 / self.serial_fraction

    @property
    def quality(self) -> str:
        if self.serial_fraction >= 1.0 - 1e-9:
            return (
                "the speedup never exceeds 1 (more devices are slower), which Amdahl's law "
                "(S >= 1) cannot describe"
            )
        if self.r2 is None:
            return "exact by construction (one device count beyond 1: no degrees of freedom)"
        word = "good" if self.r2 >= 0.95 else "fair" if self.r2 >= 0.8 else "poor"
        return f"{word} (R^2 = {self.r2:.3f}, RMSE {self.rmse:.3f}x over {self.points} points)"


def fit_amdahl(points: list[tuple[int, float]]) -> AmdahlFit | None:
    """Fit s by least squares on S itself (not on 1/S) over points with p > 1."""
    pts = [(p, s) for p, s in points if p > 1 and _finite(s)]
    if not pts:
        return None

    def sse(s: float) -> float:
        return sum((sp - amdahl_speedup(s, p)) ** 2 for p, sp in pts)

    best = _minimize_scalar(sse, 0.0, 1.0)
    res = sse(best)
    mean = statistics.fmean(sp for _, sp in pts)
    tot = sum((sp - mean) ** 2 for _, sp in pts)
    r2 = 1.0 - res / tot if len(pts) >= 2 and tot > 0 else None
    return AmdahlFit(best, math.sqrt(res / len(pts)), r2, len(pts))


def _minimize_scalar(f: Callable[[float], float], lo: float, hi: float) -> float:
    """Global minimum on a grid of 1001 points, then golden-section search around it."""
    n = 1000
    xs = [lo + (hi - lo) * i / n for i in range(n + 1)]
    i = min(range(n + 1), key=lambda k: f(xs[k]))
    a, b = xs[max(i - 1, 0)], xs[min(i + 1, n)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    x = (a + b) / 2
    return x if f(x) <= f(xs[i]) else xs[i]


@dataclass(frozen=True)
class Projection:
    """Devices beyond the measured range, from the Amdahl fit: a projection, not a measurement."""

    devices: int
    speedup: float
    throughput: float | None


@dataclass
class CurvePoint:
    config: Config
    speedup: Stat | None = None
    ceiling: Config | None = None  # the sync-none configuration at the same p
    ceiling_speedup: float | None = None

    @property
    def devices(self) -> int:
        return self.config.devices

    @property
    def efficiency(self) -> float | None:
        return self.speedup.median / self.devices if self.speedup else None

    @property
    def karp_flatt(self) -> float | None:
        return karp_flatt(self.speedup.median, self.devices) if self.speedup else None

    @property
    def contention_efficiency(self) -> float | None:
        """C / p: what p workers reach without talking to each other (hardware contention)."""
        return self.ceiling_speedup / self.devices if self.ceiling_speedup else None

    @property
    def comm_efficiency(self) -> float | None:
        """S / C: the share of the no-communication ceiling that survives synchronisation."""
        if self.speedup is None or not self.ceiling_speedup:
            return None
        return self.speedup.median / self.ceiling_speedup


@dataclass
class Curve:
    """One configuration across device counts, with its two ideals and its Amdahl fit."""

    key: tuple
    points: list[CurvePoint]
    baseline: Config | None
    baseline_note: str = ""
    fit: AmdahlFit | None = None
    projections: list[Projection] = field(default_factory=list)

    @property
    def settings(self) -> dict[str, Any]:
        return dict(zip(SETTINGS, self.key, strict=True))

    @property
    def sync(self) -> str:
        return self.settings["sync"] or ""

    @property
    def scaling(self) -> str:
        return self.settings["scaling"] or "weak"

    @property
    def label(self) -> str:
        """The configurations' label without the device count."""
        return self.points[0].config.label.split(" ", 1)[1]

    @property
    def has_ceiling(self) -> bool:
        return any(p.ceiling is not None for p in self.points)


def scaling_curves(configs: list[Config]) -> list[Curve]:
    """One curve per group of non-device settings (ok configurations only)."""
    by_curve: dict[tuple, dict[int, Config]] = {}
    for c in configs:
        if c.ok:
            by_curve.setdefault(c.curve_key, {})[c.devices] = c
    sync_i = SETTINGS.index("sync")
    curves = []
    for key, by_p in by_curve.items():
        none_key = (*key[:sync_i], NO_SYNC, *key[sync_i + 1 :])
        ceiling = by_curve.get(none_key, {}) if key[sync_i] != NO_SYNC else {}
        baseline, note = by_p.get(1), ""
        if baseline is None and 1 in by_curve.get(none_key, {}):
            baseline = by_curve[none_key][1]
            note = "no 1-device run with this sync; the 1-device sync none run is the baseline"
        elif baseline is None:
            note = "no 1-device run: speedup needs devices: 1 in the grid"
        base_perf = baseline.perf if baseline else None
        points = []
        for p in sorted(by_p):
            c = by_p[p]
            point = CurvePoint(config=c, ceiling=ceiling.get(p))
            if base_perf and c.perf:
                point.speedup = ratio(c.perf, base_perf)
            if base_perf and point.ceiling is not None and point.ceiling.perf:
                point.ceiling_speedup = point.ceiling.perf.median / base_perf.median
            points.append(point)
        curve = Curve(key=key, points=points, baseline=baseline, baseline_note=note)
        curve.fit = fit_amdahl([(pt.devices, pt.speedup.median) for pt in points if pt.speedup])
        if curve.fit and base_perf and baseline is not None:
            curve.projections = project(curve.fit, max(by_p), baseline.throughput)
        curves.append(curve)
    return curves


def project(fit: AmdahlFit, max_devices: int, base_throughput: Stat | None) -> list[Projection]:
    """The fit evaluated at 2x, 4x, 8x the largest measured device count. X(p) = X(1) * S(p)
    holds for both modes (strong: X = global batch / T)."""
    out = []
    for k in PROJECTION_FACTORS:
        p = k * max_devices
        s = fit.speedup(p)
        out.append(Projection(p, s, base_throughput.median * s if base_throughput else None))
    return out


# --------------------------------------------------------------------------- communication


def ring_allreduce_s(p: int, nbytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce time 2(p-1) alpha + 2(p-1)/p * bytes / bandwidth (nccl-tests
    PERFORMANCE.md); 0 for one device."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * nbytes / bandwidth_Bps


def bus_bandwidth(p: int, nbytes: float, seconds: float) -> float:
    """nccl-tests bus bandwidth of an all-reduce: algorithm bandwidth * 2(p-1)/p."""
    return nbytes / seconds * 2 * (p - 1) / p


@dataclass(frozen=True)
class AlphaBeta:
    alpha_s: float  # latency per ring step
    bandwidth_Bps: float  # 1 / beta
    rel_rmse: float  # fit quality: RMS relative error of the predicted times


#: The bandwidth term is fitted on the sizes at or above this fraction of the largest one.
LARGE_FRACTION = 1 / 64
#: The latency term is read off the sizes at or below this many bytes.
SMALL_BYTES = 64 * 1024


def fit_alpha_beta(p: int, sizes: list[float], seconds: list[float]) -> AlphaBeta:
    """Fit alpha and beta of the ring model to measured all-reduce times: the bandwidth from
    the large messages, the latency from the small ones.

    t = a + b * n with a = 2(p-1) alpha and b = 2(p-1)/p * beta. Measured times are not one
    straight line over six decades of sizes: NCCL switches protocol and channel count with the
    message size (a low-latency protocol for small messages, its bulk protocol only for large
    ones), so the slope at kilobytes is not the link's. One least-squares line through every size
    lets the many small sizes set the slope and underestimates the bandwidth a gradient of
    hundreds of MB sees. So the two terms are fitted where each one dominates:

    - b: ordinary least squares of t = c + b * n on the sizes >= LARGE_FRACTION x the largest
      (>= 8 MiB when the sizes reach 512 MiB; the two largest sizes if fewer qualify), on
      absolute times, so the largest messages, the size of a model's gradients, fix the slope;
      the intercept c (the bulk protocol's own start-up) is not the latency and is dropped.
    - a: the median of t - b * n over the sizes <= SMALL_BYTES (the smallest size if none is),
      where the time is almost all latency.

    The model then leaves out the bulk protocol's start-up beyond a, a few microseconds per
    ring step: a few percent of a 100 MB all-reduce over NVLink, where a slope set by the small
    sizes was off by tens of percent.

    rel_rmse is the RMS relative error of the two-term model over every size, protocol switches
    included. Needs p >= 2 and two or more sizes.
    """
    if p < 2:
        raise ValueError("an all-reduce over one device moves nothing; calibrate with p >= 2")
    pts = sorted((float(n), float(t)) for n, t in zip(sizes, seconds, strict=True) if t > 0)
    distinct = sorted({n for n, _ in pts})
    if len(distinct) < 2:
        raise ValueError("need at least two message sizes to separate latency from bandwidth")
    cut = min(distinct[-1] * LARGE_FRACTION, distinct[-2])
    large = [(n, t) for n, t in pts if n >= cut]
    mn = statistics.fmean(n for n, _ in large)
    mt = statistics.fmean(t for _, t in large)
    b = sum((n - mn) * (t - mt) for n, t in large) / sum((n - mn) ** 2 for n, _ in large)
    if b <= 0:
        raise ValueError("all-reduce time does not grow with message size; add larger sizes")
    small = [(n, t) for n, t in pts if n <= SMALL_BYTES] or [pts[0]]
    a = max(0.0, statistics.median(t - b * n for n, t in small))
    rel = [(a + b * n - t) / t for n, t in pts]
    return AlphaBeta(
        alpha_s=a / (2 * (p - 1)),
        bandwidth_Bps=2 * (p - 1) / p / b,
        rel_rmse=math.sqrt(statistics.fmean(r * r for r in rel)),
    )


# --------------------------------------------------------------------------- efficiency, cost


def mfu(achieved_flops: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over all ranks / (p * peak per device)."""
    return achieved_flops / (devices * peak_flops_per_device)


def device_hours_per_million(devices: int, throughput: float) -> float:
    """Device-hours one million samples take: the price-free cost."""
    return devices * 1e6 / throughput / 3600.0


def cost_per_million(devices: int, throughput: float, price_per_device_hour: float) -> float:
    return device_hours_per_million(devices, throughput) * price_per_device_hour


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of (throughput, cost) points no other point beats on both (more throughput for
    no more cost, or less cost for no less throughput), sorted by cost."""
    front = []
    for i, (x, c) in enumerate(points):
        dominated = any(
            (x2 >= x and c2 <= c) and (x2 > x or c2 < c)
            for j, (x2, c2) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: (points[i][1], -points[i][0]))
