"""Hand-written inline SVG charts: line/scatter plots with error bars and stacked bar charts.

No plotting library and nothing fetched: each function returns one `<svg>` element as a string.
Drawn marks carry class="data" so a test can check that a browser laid them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
    "#bcbd22",
]
_FONT = 'font-family="system-ui, sans-serif"'


@dataclass
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    color: str = PALETTE[0]
    dash: str = ""  # stroke-dasharray, e.g. "6 4"
    markers: bool = True
    line: bool = True
    lo: list[float] | None = None  # error bar ends
    hi: list[float] | None = None
    point_labels: list[str] = field(default_factory=list)
    legend: bool = True  # False: drawn, but not listed in the legend


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step
    ticks, t = [], start
    while t < hi + step * 0.999:
        ticks.append(round(t, 12))
        t += step
    return ticks


def fmt_tick(v: float) -> str:
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a == 0 or a >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


class _Axes:
    def __init__(self, x0: float, y0: float, w: float, h: float, xr, yr, xlog2: bool):
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.xr, self.yr, self.xlog2 = xr, yr, xlog2

    def x(self, v: float) -> float:
        lo, hi = self.xr
        if self.xlog2:
            v, lo, hi = math.log2(v), math.log2(lo), math.log2(hi)
        return self.x0 + (v - lo) / (hi - lo) * self.w

    def y(self, v: float) -> float:
        lo, hi = self.yr
        return self.y0 + self.h - (v - lo) / (hi - lo) * self.h


#: A line plot's size in pixels, its legend below it.
PLOT_WIDTH, PLOT_HEIGHT = 640, 320


def line_plot(
    plot_id: str,
    title: str,
    xlabel: str,
    ylabel: str,
    series: list[Series],
    *,
    xlog2: bool = False,
) -> str:
    """Lines and/or markers with optional error bars, from y = 0 up; legend below the plot."""
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in (*s.ys, *(s.lo or []), *(s.hi or []))]
    ys = [y for y in ys if math.isfinite(y)]
    left, right, top, bottom = 70, 20, 34, 44
    legend_h = 18 * sum(s.legend for s in series) + 6
    w, h = PLOT_WIDTH - left - right, PLOT_HEIGHT - top - bottom
    xticks = _log2_ticks(xs) if xlog2 else nice_ticks(min(xs), max(xs))
    yticks = nice_ticks(min([*ys, 0.0]), max(ys) * 1.05 if max(ys) > 0 else 1.0)
    ax = _Axes(left, top, w, h, (xticks[0], xticks[-1]), (yticks[0], yticks[-1]), xlog2)
    out = [_open(plot_id, PLOT_WIDTH, PLOT_HEIGHT + legend_h, title)]
    out += _frame(ax, xticks, yticks, xlabel, ylabel)
    for s in series:
        out += _series_marks(ax, s)
    out += _legend(series, left, PLOT_HEIGHT)
    out.append("</svg>")
    return "\n".join(out)


def _log2_ticks(xs: list[float]) -> list[float]:
    """Powers of two spanning `xs` (at least two of them)."""
    lo2, hi2 = math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs)))
    if hi2 == lo2:
        lo2, hi2 = lo2 - 1, hi2 + 1
    return [2.0**k for k in range(lo2, hi2 + 1)]


def _series_marks(ax: _Axes, s: Series) -> list[str]:
    """One series' error bars, line, markers and point labels."""
    out = []
    pts = [(ax.x(x), ax.y(y)) for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
    bars = zip(s.xs, s.lo, s.hi, strict=True) if s.lo and s.hi else ()
    for x, lo, hi in bars:
        if hi > lo:
            px = ax.x(x)
            out.append(
                f'<path class="data" d="M{px:.1f} {ax.y(lo):.1f}V{ax.y(hi):.1f}'
                f'M{px - 4:.1f} {ax.y(lo):.1f}h8M{px - 4:.1f} {ax.y(hi):.1f}h8" '
                f'stroke="{s.color}" fill="none"/>'
            )
    if s.line and len(pts) > 1:
        d = "M" + "L".join(f"{x:.1f} {y:.1f}" for x, y in pts)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(
            f'<path class="data" d="{d}" stroke="{s.color}" stroke-width="2" fill="none"{dash}/>'
        )
    if s.markers:
        out += [
            f'<circle class="data" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{s.color}"/>'
            for x, y in pts
        ]
    out += [
        f'<text x="{x + 6:.1f}" y="{y - 6:.1f}" font-size="10" {_FONT} '
        f'fill="#333">{escape(text)}</text>'
        for (x, y), text in zip(pts, s.point_labels, strict=False)
        if text
    ]
    return out


def stacked_bars(
    plot_id: str,
    title: str,
    xlabel: str,
    categories: list[str],
    segments: list[tuple[str, list[float], str]],
    width: int = 760,
) -> str:
    """Horizontal stacked bars: one bar per category, one coloured segment per (name, values)."""
    bar_h, gap = 18, 8
    left = min(20 + 6.2 * max((len(c) for c in categories), default=10), 320)
    top, right, bottom = 34, 20, 44
    h = len(categories) * (bar_h + gap)
    legend_h = 18 * ((len(segments) + 2) // 3) + 6
    height = top + h + bottom
    totals = [sum(vals[i] for _, vals, _ in segments) for i in range(len(categories))]
    xticks = nice_ticks(0.0, max(totals) if totals and max(totals) > 0 else 1.0)
    ax = _Axes(left, top, width - left - right, h, (xticks[0], xticks[-1]), (0, 1), False)
    out = [_open(plot_id, width, height + legend_h, title)]
    out.append(
        f'<line x1="{left}" y1="{top + h}" x2="{left + ax.w}" y2="{top + h}" stroke="#333"/>'
    )
    for t in xticks:
        x = ax.x(t)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="#eee"/>')
        out.append(
            f'<text x="{x:.1f}" y="{top + h + 16}" font-size="11" text-anchor="middle" '
            f"{_FONT}>{fmt_tick(t)}</text>"
        )
    out.append(
        f'<text x="{left + ax.w / 2:.1f}" y="{top + h + 36}" font-size="12" '
        f'text-anchor="middle" {_FONT}>{escape(xlabel)}</text>'
    )
    for i, cat in enumerate(categories):
        y = top + i * (bar_h + gap) + gap / 2
        out.append(
            f'<text x="{left - 6}" y="{y + bar_h * 0.72:.1f}" font-size="11" text-anchor="end" '
            f"{_FONT}>{escape(cat)}</text>"
        )
        acc = 0.0
        for name, vals, color in segments:
            v = vals[i]
            if v <= 0:
                continue
            x1, x2 = ax.x(acc), ax.x(acc + v)
            out.append(
                f'<rect class="data" x="{x1:.1f}" y="{y:.1f}" width="{max(x2 - x1, 0.5):.1f}" '
                f'height="{bar_h}" fill="{color}"><title>{escape(name)}: {v:.3g}</title></rect>'
            )
            acc += v
    for k, (name, _, color) in enumerate(segments):
        lx, ly = left + (k % 3) * 200, height + 4 + (k // 3) * 18
        out.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{color}"/>')
        out.append(
            f'<text x="{lx + 18}" y="{ly + 10}" font-size="11" {_FONT}>{escape(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _open(plot_id: str, width: float, height: float, title: str) -> str:
    return (
        f'<svg class="plot" data-plot="{escape(plot_id)}" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img">'
        f"<title>{escape(title)}</title>"
        f'<rect width="100%" height="100%" fill="#fff"/>'
        f'<text x="{width / 2:.0f}" y="20" font-size="14" font-weight="bold" '
        f'text-anchor="middle" {_FONT}>{escape(title)}</text>'
    )


def _frame(ax: _Axes, xticks, yticks, xlabel: str, ylabel: str) -> list[str]:
    out = []
    for t in yticks:
        y = ax.y(t)
        out.append(
            f'<line x1="{ax.x0}" y1="{y:.1f}" x2="{ax.x0 + ax.w}" y2="{y:.1f}" stroke="#eee"/>'
        )
        out.append(
            f'<text x="{ax.x0 - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f"{_FONT}>{fmt_tick(t)}</text>"
        )
    for t in xticks:
        x = ax.x(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{ax.y0}" x2="{x:.1f}" y2="{ax.y0 + ax.h}" stroke="#f3f3f3"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{ax.y0 + ax.h + 16}" font-size="11" text-anchor="middle" '
            f"{_FONT}>{fmt_tick(t)}</text>"
        )
    out.append(
        f'<rect x="{ax.x0}" y="{ax.y0}" width="{ax.w}" height="{ax.h}" fill="none" stroke="#333"/>'
    )
    out.append(
        f'<text x="{ax.x0 + ax.w / 2:.1f}" y="{ax.y0 + ax.h + 36}" font-size="12" '
        f'text-anchor="middle" {_FONT}>{escape(xlabel)}</text>'
    )
    cy = ax.y0 + ax.h / 2
    out.append(
        f'<text x="16" y="{cy:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 16 {cy:.1f})" {_FONT}>{escape(ylabel)}</text>'
    )
    return out


def _legend(series: list[Series], left: float, top: float) -> list[str]:
    out = []
    for i, s in enumerate([s for s in series if s.legend]):
        y = top + 6 + i * 18
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        if s.line:
            out.append(
                f'<line x1="{left}" y1="{y + 6}" x2="{left + 28}" y2="{y + 6}" '
                f'stroke="{s.color}" stroke-width="2"{dash}/>'
            )
        if s.markers:
            out.append(f'<circle cx="{left + 14}" cy="{y + 6}" r="4" fill="{s.color}"/>')
        out.append(
            f'<text x="{left + 36}" y="{y + 10}" font-size="11" {_FONT}>{escape(s.label)}</text>'
        )
    return out
