"""Speedup-vs-ideal report: pure functions over the results table, then renderers.

Weak scaling (fixed per-device batch): S(p) = throughput(p) / throughput(1).
Strong scaling (fixed global batch):   S(p) = T(1) / T(p), which for a fixed amount of work is
again the throughput ratio. Ideal S = p; efficiency E = S / p (GUIDE, "Formulas").
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from amdahl.results import read_results

#: Settings that define a configuration apart from the device count.
GROUP_BY = ("workload", "params", "batch_size", "precision", "compile", "data_workers", "sync")


@dataclass(frozen=True)
class ScalingPoint:
    devices: int
    throughput: float  # median over ok repeats
    spread: float  # (max - min) / median over repeats; 0 with one repeat
    repeats: int
    speedup: float | None  # None when the group has no 1-device baseline
    efficiency: float | None


@dataclass(frozen=True)
class ScalingCurve:
    settings: dict[str, object]
    points: list[ScalingPoint]


def scaling_curves(table: pa.Table) -> list[ScalingCurve]:
    """One curve per group of non-device settings, from the ok rows only."""
    groups: dict[tuple, dict[int, list[float]]] = {}
    for row in table.to_pylist():
        if row["status"] != "ok" or row["throughput"] is None:
            continue
        key = tuple(row[c] for c in GROUP_BY)
        groups.setdefault(key, {}).setdefault(row["devices"], []).append(row["throughput"])
    curves = []
    for key, by_devices in groups.items():
        base = statistics.median(by_devices[1]) if 1 in by_devices else None
        points = []
        for p in sorted(by_devices):
            values = by_devices[p]
            median = statistics.median(values)
            speedup = median / base if base else None
            points.append(
                ScalingPoint(
                    devices=p,
                    throughput=median,
                    spread=(max(values) - min(values)) / median if median else 0.0,
                    repeats=len(values),
                    speedup=speedup,
                    efficiency=speedup / p if speedup is not None else None,
                )
            )
        curves.append(ScalingCurve(settings=dict(zip(GROUP_BY, key, strict=True)), points=points))
    return curves


def render_terminal(sweep_dir: str | Path) -> str:
    """The scaling table as plain text (rich renders it in the CLI)."""
    table = read_results(sweep_dir)
    lines = [f"Sweep {Path(sweep_dir).name}: {table.num_rows} rows"]
    for curve in scaling_curves(table):
        s = curve.settings
        lines.append(
            f"\n{s['workload']} batch={s['batch_size']} {s['precision']} "
            f"{s['compile']} workers={s['data_workers']} sync={s['sync']}"
        )
        lines.append(
            f"  {'devices':>7} {'samples/s':>12} {'spread':>7} {'speedup':>8} "
            f"{'ideal':>6} {'efficiency':>10}"
        )
        for p in curve.points:
            sp = f"{p.speedup:.2f}x" if p.speedup is not None else "n/a"
            eff = f"{p.efficiency:.0%}" if p.efficiency is not None else "n/a"
            lines.append(
                f"  {p.devices:>7} {p.throughput:>12,.0f} {p.spread:>7.1%} {sp:>8} "
                f"{p.devices:>5}x {eff:>10}"
            )
    failed = [r for r in table.to_pylist() if r["status"] != "ok"]
    if failed:
        lines.append("\nNot ok:")
        for r in failed:
            reason = (r["error"] or "").splitlines()[0] if r["error"] else ""
            lines.append(
                f"  d{r['devices']} b{r['batch_size']} {r['precision']} {r['sync']}: "
                f"{r['status']} {reason}"
            )
    return "\n".join(lines)
