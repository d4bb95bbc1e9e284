"""Which configurations qualify and which is best: each configuration's validation quality
against its plain fp32/eager twin (a worse one is flagged and never recommended), then the
fastest, the fastest per device and the cheapest of the rest, with ties and the Pareto front.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amdahl.analysis.configs import NO_SYNC, Config
from amdahl.analysis.cost import cost_per_million, pareto_front
from amdahl.analysis.stats import Stat, differs
from amdahl.report.bottleneck import THRESHOLDS
from amdahl.report.diagnose import twin_key

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
        ref = by_key.get(twin_key(c, precision="fp32", compile="eager", sync=s))
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


def _not_a_way_to_train(c: Config, quality: dict[tuple, QualityCheck]) -> str | None:
    """Why an ok configuration cannot be recommended (the no-communication ceiling, or worse
    training than its reference), or None."""
    if c.sync == NO_SYNC and c.devices > 1:
        return (
            "sync none with p > 1 is the no-communication ceiling (each worker trains "
            "its own model), a measurement, not a way to train"
        )
    check = quality.get(c.key)
    return check.text if check and check.worse else None


def recommend(
    configs: list[Config], quality: dict[tuple, QualityCheck], price: float = 0.0
) -> Recommendation:
    rec = Recommendation(price=price)
    eligible = []
    for c in (c for c in configs if c.ok):
        why = _not_a_way_to_train(c, quality)
        if why:
            rec.excluded.append((c, why))
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
