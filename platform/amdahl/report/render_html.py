"""One self-contained HTML file: the report document plus inline SVG plots (nothing fetched);
the overview sorts and filters in the page and long parts fold away (html_overview.py).

Plots: throughput vs devices with the linear ideal and the no-communication ceiling (one per
curve), efficiency vs devices (with the Amdahl projection, labelled), stacked per-step breakdown
per configuration, peak memory vs batch size, and throughput against cost with its Pareto front.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from amdahl.analysis.configs import NO_SYNC, SETTINGS
from amdahl.report.build import Report
from amdahl.report.diagnose import SEGMENTS
from amdahl.report.document import TEXT_COLUMNS, Section, Table
from amdahl.report.html_overview import (
    CSS,
    LONG_LIST,
    LONG_TABLE,
    SCRIPT,
    details,
    family_summary,
    long_table_summary,
    overview_html,
)
from amdahl.report.sections import sections
from amdahl.report.svg import PALETTE, Series, line_plot, stacked_bars
from amdahl.strategies import STRATEGIES

#: At most this many per-curve throughput plots (the efficiency plot shows every curve).
MAX_CURVE_PLOTS = 12
_SEGMENT_COLORS = ["#9467bd", "#1f77b4", "#2ca02c", "#bcbd22", "#d62728", "#7f7f7f"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
caption { text-align: left; font-weight: bold; padding: 4px 0; }
figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; }
th.t, td.t { text-align: left; } .flag { color: #b00; font-weight: bold; }
"""


def plots(report: Report) -> dict[str, list[tuple[str, str]]]:
    """Section key -> [(svg, caption)], only for plots that have data."""
    out: dict[str, list[tuple[str, str]]] = {}
    pareto = _pareto_plot(report)
    if pareto:
        out.setdefault("recommendation", []).append(pareto)
    for label, plot in _throughput_plots(report):
        out[f"curve:{label}"] = [plot]  # drawn inside its family's <details>
    eff = _efficiency_plot(report)
    if eff:
        out.setdefault("scaling", []).append(eff)
    bars = _breakdown_plot(report)
    if bars:
        out.setdefault("breakdown", []).append(bars)
    mem = _memory_plot(report)
    if mem:
        out.setdefault("efficiency", []).append(mem)
    predicted = _predicted_plot(report)
    if predicted:
        out.setdefault("predicted", []).append(predicted)
    return out


def _throughput_plots(report: Report) -> list[tuple[str, tuple[str, str]]]:
    """(curve label, (svg, caption)) for the first MAX_CURVE_PLOTS curves, in ranked order."""
    out = []
    shown = [c for c in report.curves if len(c.points) > 1]
    synced_keys = {c.key for c in report.curves if c.sync != NO_SYNC}
    shown = [
        c for c in shown if c.sync != NO_SYNC or not any(_pairs(c.key, k) for k in synced_keys)
    ]
    for i, curve in enumerate(shown[:MAX_CURVE_PLOTS]):
        pts = curve.points
        xs = [float(p.devices) for p in pts]
        series = [
            Series(
                f"measured ({curve.sync})",
                xs,
                [p.config.throughput.median for p in pts],
                PALETTE[0],
                lo=[p.config.throughput.lo for p in pts],
                hi=[p.config.throughput.hi for p in pts],
            )
        ]
        if curve.baseline is not None:
            x1 = curve.baseline.throughput.median
            series.append(
                Series("linear ideal p * X(1)", xs, [x * x1 for x in xs], "#555", "6 4", False)
            )
        ceil = [p for p in pts if p.ceiling is not None]
        if ceil:
            series.append(
                Series(
                    "no-comm ceiling (sync none)",
                    [float(p.devices) for p in ceil],
                    [p.ceiling.throughput.median for p in ceil],
                    PALETTE[2],
                    "2 3",
                )
            )
        svg = line_plot(
            f"throughput-{i}",
            f"Throughput vs devices: {curve.label}",
            "devices",
            "samples/s",
            series,
            xlog2=True,
        )
        caption = f"{curve.label}: measured (min-max bars over repeats) with both ideals."
        out.append((curve.label, (svg, caption)))
    return out


def _pairs(none_key: tuple, synced_key: tuple) -> bool:
    """True when a sync-none curve is the ceiling of a synchronised one (drawn there)."""
    i = SETTINGS.index("sync")
    return none_key[:i] == synced_key[:i] and none_key[i + 1 :] == synced_key[i + 1 :]


def _efficiency_plot(report: Report) -> tuple[str, str] | None:
    """Synchronised curves (sync none is drawn as the ceiling instead), dashed projections."""
    curves = [
        c
        for c in report.curves
        if sum(p.efficiency is not None for p in c.points) > 1
        and (c.sync != NO_SYNC or not any(x.sync != NO_SYNC for x in report.curves))
    ]
    series = []
    projected = False
    for i, curve in enumerate(curves[:MAX_CURVE_PLOTS]):
        pts = [p for p in curve.points if p.efficiency is not None]
        color = PALETTE[i % len(PALETTE)]
        series.append(
            Series(
                curve.label,
                [float(p.devices) for p in pts],
                [p.efficiency for p in pts],
                color,
                lo=[p.speedup.lo / p.devices for p in pts],
                hi=[p.speedup.hi / p.devices for p in pts],
            )
        )
        if curve.projections and curve.fit and curve.fit.serial_fraction < 1:
            projected = True
            last = pts[-1]
            series.append(
                Series(
                    "",
                    [float(last.devices)] + [float(p.devices) for p in curve.projections],
                    [last.efficiency] + [p.speedup / p.devices for p in curve.projections],
                    color,
                    "4 4",
                    False,
                    legend=False,
                )
            )
    if not series:
        return None
    xs = [x for s in series for x in s.xs]
    series.insert(0, Series("ideal (E = 1)", [min(xs), max(xs)], [1.0, 1.0], "#555", "6 4", False))
    if projected:
        series.append(
            Series(
                "dashed: PROJECTION (Amdahl fit), descriptive, not measured",
                [],
                [],
                "#999",
                "4 4",
                False,
            )
        )
    svg = line_plot(
        "efficiency", "Efficiency S/p vs devices", "devices", "efficiency", series, xlog2=True
    )
    shown = "" if len(curves) <= MAX_CURVE_PLOTS else f" (first {MAX_CURVE_PLOTS} curves)"
    return svg, (
        f"Measured efficiency{shown} with min-max bars, and the Amdahl-fit projection "
        "(dashed, not measured)."
    )


def _predicted_plot(report: Report) -> tuple[str, str] | None:
    """Each measured point against the step-time model's leave-one-out prediction."""
    pts = [p for p in report.predicted.loo if p.predicted and p.measured]
    if not pts:
        return None
    series = []
    for i, p in enumerate(sorted({p.config.devices for p in pts})):
        mine = [q for q in pts if q.config.devices == p]
        series.append(
            Series(
                f"{p} device(s)",
                [q.measured for q in mine],
                [q.predicted for q in mine],
                PALETTE[i % len(PALETTE)],
                line=False,
            )
        )
    values = [v for q in pts for v in (q.measured, q.predicted)]
    lo, hi = min(values), max(values)
    series.insert(0, Series("predicted = measured", [lo, hi], [lo, hi], "#555", "6 4", False))
    svg = line_plot(
        "predicted",
        "Step-time model (leave-one-out) against measurement",
        "measured samples/s",
        "predicted samples/s",
        series,
    )
    return svg, (
        "Each measured configuration against the model refitted without it: on the dashed "
        "line the prediction is exact."
    )


def _breakdown_plot(report: Report) -> tuple[str, str] | None:
    diags = [d for d in report.diagnoses if d.wall_s]
    if not diags:
        return None
    segments = [
        (name, [d.segments.get(name, 0.0) * 1e3 for d in diags], color)
        for name, color in zip(SEGMENTS, _SEGMENT_COLORS, strict=True)
    ]
    svg = stacked_bars(
        "breakdown",
        "Where each step's time went",
        "ms per optimizer step",
        [d.config.label for d in diags],
        segments,
    )
    return (
        svg,
        "Per-step breakdown (medians over repeats); exposed comm is measured against sync none.",
    )


#: Strategies whose memory per device depends on the device count (sharded state).
_SHARDED = frozenset(n for n, s in STRATEGIES.items() if s.sharded)


def _memory_plot(report: Report) -> tuple[str, str] | None:
    """Peak memory per device against batch size, one line per precision/compile/sync (the
    largest over device counts, except for sharded strategies, drawn per device count)."""
    groups: dict[tuple, dict[float, float]] = {}
    for c in report.configs:
        mem = c.stat("peak_mem_bytes")
        if not c.ok or mem is None or mem.median <= 0 or not c.batch_size:
            continue
        s = c.settings
        key = (s["precision"], s["compile"], s["sync"], c.devices if c.sync in _SHARDED else None)
        line = groups.setdefault(key, {})
        b = float(c.batch_size)
        line[b] = max(line.get(b, 0.0), mem.median / 2**20)
    if not groups:
        return None
    series = []
    for i, (key, line) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        label = " ".join(str(k) for k in key[:3]) + (f" d{key[3]}" if key[3] else "")
        xs = sorted(line)
        series.append(Series(label, xs, [line[x] for x in xs], PALETTE[i % len(PALETTE)]))
    svg = line_plot(
        "memory",
        "Peak memory per device vs batch size",
        "batch size per device",
        "MiB",
        series,
        xlog2=True,
    )
    return svg, (
        "Peak memory per device (largest over device counts): CUDA max allocated; on CPU, peak "
        "resident memory above the pre-trial baseline."
    )


def _pareto_plot(report: Report) -> tuple[str, str] | None:
    rec = report.recommendation
    if not rec.pareto_points:
        return None
    front = set(id(c) for c in rec.pareto)
    pts = rec.pareto_points
    series = [
        Series(
            "configurations",
            [k for _, _, k in pts],
            [x for _, x, _ in pts],
            "#999",
            line=False,
        )
    ]
    fr = sorted(((k, x, c) for c, x, k in pts if id(c) in front), key=lambda t: t[0])
    series.append(
        Series(
            "Pareto front",
            [k for k, _, _ in fr],
            [x for _, x, _ in fr],
            PALETTE[1],
            point_labels=[c.label for _, _, c in fr],
        )
    )
    svg = line_plot("pareto", "Throughput against cost", rec.cost_label, "samples/s", series)
    unit = "$ at spec.yaml's price" if report.price > 0 else "device-hours (no price in spec.yaml)"
    return (
        svg,
        f"Cost per million samples in {unit}; the front: nothing is both faster and cheaper.",
    )


def to_html(report: Report, extra: list[Section] | None = None) -> str:
    figures = plots(report)
    body = []
    for i, sec in enumerate(sections(report) + list(extra or [])):
        body.append(
            f'<h{1 if i == 0 else 2} id="{escape(sec.key)}">{escape(sec.title)}'
            f"</h{1 if i == 0 else 2}>"
        )
        body += [f"<p>{escape(p)}</p>" for p in sec.paras]
        if sec.key == "overview" and report.ranking.families:
            body.append(overview_html(report))
        elif sec.key == "scaling":
            body += _family_tables(report, sec.tables, figures)
        else:
            body += [_table_block(t, sec.title) for t in sec.tables]
        for svg, caption in figures.get(sec.key, []):
            body.append(_figure(svg, caption))
        if sec.bullets:
            items = "<ul>" + "".join(f"<li>{escape(b)}</li>" for b in sec.bullets) + "</ul>"
            if len(sec.bullets) > LONG_LIST:
                items = details(f"{escape(sec.title)}: {len(sec.bullets)} notes", items)
            body.append(items)
        if sec.links:
            items = (
                "<ul>"
                + "".join(
                    f'<li><a href="{escape(quote(path))}">{escape(text)}</a></li>'
                    for text, path in sec.links
                )
                + "</ul>"
            )
            if len(sec.links) > LONG_LIST:
                items = details(f"{escape(sec.title)}: {len(sec.links)} files", items)
            body.append(items)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>amdahl report: {escape(report.name)}</title><style>{_CSS}{CSS}</style></head>\n"
        "<body>\n" + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _family_tables(report: Report, tables: list[Table], figures: dict) -> list[str]:
    """Each curve's table, notes and plot in a <details>, in ranked order, the best open."""
    ranking = report.ranking
    rank = {f.label: i + 1 for i, f in enumerate(ranking.families)}
    fams = {f.label: f for f in ranking.families}
    out = []
    for k, t in enumerate(tables):
        inner = _html_table(t) + _notes(t)
        inner += "".join(_figure(svg, cap) for svg, cap in figures.get(f"curve:{t.title}", []))
        head = family_summary(
            rank.get(t.title, k + 1), fams.get(t.title), t.title, ranking.describe
        )
        out.append(details(head, inner, open_=k == 0))
    return out


def _table_block(t: Table, section_title: str) -> str:
    """A table with its notes; collapsed when long (LONG_TABLE rows)."""
    html = _html_table(t) + _notes(t)
    if len(t.rows) > LONG_TABLE:
        html = details(long_table_summary(t, section_title), html)
    return html


def _notes(t: Table) -> str:
    if not t.notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in t.notes) + "</ul>"


def _html_table(t: Table) -> str:
    text = [h in TEXT_COLUMNS or h.startswith("against") for h in t.headers]
    head = "".join(
        f'<th class="t">{escape(h)}</th>' if left else f"<th>{escape(h)}</th>"
        for h, left in zip(t.headers, text, strict=True)
    )
    rows = []
    for r in t.rows:
        cells = "".join(
            f'<td class="{"flag " if v == "FLAGGED" else ""}{"t" if left else ""}">{escape(v)}</td>'
            for v, left in zip(r, text, strict=True)
        )
        rows.append(f"<tr>{cells}</tr>")
    caption = f"<caption>{escape(t.title)}</caption>" if t.title else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
