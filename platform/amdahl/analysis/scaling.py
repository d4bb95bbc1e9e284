"""Scaling curves: one configuration across device counts, its speedup against one device, its
two ideals and its Amdahl fit, with the fit's projection beyond the measured range.

- Speedup (docs/architecture.md): weak scaling (fixed per-device batch) S(p) = X(p) / X(1), the
  throughput ratio; strong scaling (fixed global batch) S(p) = T(1) / T(p), the ratio of seconds
  per optimizer step. Ideal S = p; efficiency E = S / p.
- Two ideals per curve: linear (p * X(1)) and the measured no-communication ceiling, the same
  settings with sync "none" (every worker trains alone). E = (C/p) * (S/C) splits the gap into
  hardware contention (C/p) and communication (S/C).
- Amdahl: S(p) = 1 / (s + (1 - s) / p); Karp-Flatt e = (1/S - 1/p) / (1 - 1/p).
- The baseline: the 1-device run with the curve's own sync, which runs inside the strategy's
  wrapper (DDP's reducer on one device); people training on one device run no wrapper, so where
  the 1-device sync none run is faster beyond the spread, the curve also carries the speedup
  against it (`unwrapped`) and the report shows both.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.configs import NO_SYNC, SETTINGS, Config, SyncAndScaling
from amdahl.analysis.stats import Stat, differs, is_number, minimize_scalar, ratio

#: Device-count multiples of the largest measured count that the Amdahl fit projects to.
PROJECTION_FACTORS = (2, 4, 8)


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
    pts = [(p, s) for p, s in points if p > 1 and is_number(s)]
    if not pts:
        return None

    def sse(s: float) -> float:
        return sum((sp - amdahl_speedup(s, p)) ** 2 for p, sp in pts)

    best = minimize_scalar(sse, 0.0, 1.0, grid=1000, iterations=60)
    res = sse(best)
    mean = statistics.fmean(sp for _, sp in pts)
    tot = sum((sp - mean) ** 2 for _, sp in pts)
    r2 = 1.0 - res / tot if len(pts) >= 2 and tot > 0 else None
    return AmdahlFit(best, math.sqrt(res / len(pts)), r2, len(pts))


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
    #: Against the 1-device sync none run, where the curve has `unwrapped`.
    speedup_unwrapped: Stat | None = None

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
class Curve(SyncAndScaling):
    """One configuration across device counts, with its two ideals and its Amdahl fit."""

    key: tuple
    points: list[CurvePoint]
    baseline: Config | None
    baseline_note: str = ""
    fit: AmdahlFit | None = None
    projections: list[Projection] = field(default_factory=list)
    #: The 1-device sync none run when it differs from `baseline` beyond the spread.
    unwrapped: Config | None = None

    @property
    def baseline_text(self) -> str:
        """Which 1-device run the speedups divide by."""
        b = self.baseline
        if b is None:
            return "no 1-device run: no speedup"
        if b.sync == NO_SYNC:
            return "the 1-device sync none run (no wrapper: a plain one-device training loop)"
        return f"the 1-device {b.sync} run (inside the {b.sync} wrapper, as the sweep ran it)"

    @property
    def settings(self) -> dict[str, Any]:
        return dict(zip(SETTINGS, self.key, strict=True))

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
        _add_unwrapped(curve, by_curve.get(none_key, {}).get(1))
        curve.fit = fit_amdahl([(pt.devices, pt.speedup.median) for pt in points if pt.speedup])
        if curve.fit and base_perf and baseline is not None:
            curve.projections = project(curve.fit, max(by_p), baseline.throughput)
        curves.append(curve)
    return curves


def _add_unwrapped(curve: Curve, none_one: Config | None) -> None:
    """The speedups against the 1-device sync none run, when that run's figure differs from the
    curve's own baseline beyond the larger spread (stats.differs)."""
    base = curve.baseline
    if base is None or none_one is None or base is none_one or base.sync == NO_SYNC:
        return
    if not base.perf or not none_one.perf or not differs(base.perf, none_one.perf):
        return
    curve.unwrapped = none_one
    for pt in curve.points:
        if pt.config.perf:
            pt.speedup_unwrapped = ratio(pt.config.perf, none_one.perf)


def project(fit: AmdahlFit, max_devices: int, base_throughput: Stat | None) -> list[Projection]:
    """The fit evaluated at 2x, 4x, 8x the largest measured device count. X(p) = X(1) * S(p)
    holds for both modes (strong: X = global batch / T)."""
    out = []
    for k in PROJECTION_FACTORS:
        p = k * max_devices
        s = fit.speedup(p)
        out.append(Projection(p, s, base_throughput.median * s if base_throughput else None))
    return out
