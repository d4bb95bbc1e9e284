"""What makes report.html read at any size: the overview table with each family's devices curve
as a sparkline, sorted by a click on a header and filtered by a text box in the page (a few
lines of inline script: no server, nothing fetched, the file stays self-contained), and
collapsible `<details>` for the per-family scaling tables and other long tables.

The overview's cells are overview.py's, so report.md and report.html show the same figures.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import math
from html import escape

from amdahl.report.build import Report
from amdahl.report.document import TEXT_COLUMNS, Table
from amdahl.report.overview import overview_table
from amdahl.report.ranking import Family

#: Tables with more rows than this, and bullet lists longer than _LONG_LIST, start collapsed.
LONG_TABLE = 20
LONG_LIST = 10

CSS = """
.ovwrap { max-height: 75vh; overflow: auto; border: 1px solid #ddd; }
.ovwrap table { margin: 0; } #overview-table td { white-space: nowrap; }
.ovwrap thead th { position: sticky; top: 0; background: #f6f6f6; z-index: 1; }
table.sortable th[data-sort] { cursor: pointer; user-select: none; }
table.sortable th[aria-sort=ascending]::after { content: " \\25B2"; }
table.sortable th[aria-sort=descending]::after { content: " \\25BC"; }
tr.best td { background: #eef6ee; font-weight: 600; }
.filter { margin: 0.6em 0; } .filter input { width: 24em; padding: 3px 6px; }
svg.spark { vertical-align: middle; }
details { margin: 0.4em 0; } summary { cursor: pointer; padding: 2px 0; }
ul.notes { margin-top: 0; font-size: 0.9em; }
"""

#: Sort: numbers where most filled cells of the column read as one ("21,441", "85% at d2"; a
#: cell that does not, such as "oom", goes last with the blanks), else text with numeric parts
#: compared as numbers ("d2" < "d16").
#: Filter: rows holding every word typed, case-insensitive.
SCRIPT = """
(function () {
  const table = document.getElementById('overview-table');
  if (!table) return;
  const body = table.tBodies[0];
  const num = s => { const t = s.trim().replace(/,/g, '');
    return /^-?\\d*\\.?\\d+/.test(t) ? parseFloat(t) : NaN; };
  table.querySelectorAll('th[data-sort]').forEach(th => th.addEventListener('click', () => {
    const col = th.cellIndex;
    const dir = th.getAttribute('aria-sort') === 'ascending' ? -1 : 1;
    table.querySelectorAll('th[aria-sort]').forEach(h => h.removeAttribute('aria-sort'));
    th.setAttribute('aria-sort', dir === 1 ? 'ascending' : 'descending');
    const rows = [...body.rows];
    const cells = rows.map(r => r.cells[col].textContent.trim());
    const filled = cells.filter(c => c !== '' && c !== 'n/a');
    const numeric = filled.filter(c => !isNaN(num(c))).length * 2 > filled.length;
    const key = c => (c === '' || c === 'n/a' || (numeric && isNaN(num(c)))) ? null
      : (numeric ? num(c) : c);
    const order = rows.map((r, i) => [key(cells[i]), i, r]).sort((a, b) => {
      if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null) || a[1] - b[1];
      const d = numeric ? a[0] - b[0] : a[0].localeCompare(b[0], undefined, {numeric: true});
      return dir * d || a[1] - b[1];
    });
    order.forEach(o => body.appendChild(o[2]));
  }));
  const box = document.getElementById('overview-filter');
  const count = document.getElementById('overview-count');
  box.addEventListener('input', () => {
    const words = box.value.toLowerCase().split(/\\s+/).filter(w => w);
    let shown = 0;
    for (const r of body.rows) {
      const text = r.textContent.toLowerCase();
      const hit = words.every(w => text.includes(w));
      r.hidden = !hit; shown += hit;
    }
    count.textContent = shown + ' of ' + body.rows.length + ' shown';
  });
})();
"""


def overview_html(report: Report) -> str:
    """The overview table (overview.py's cells) with a sparkline column, sortable and
    filterable in the page; the first row (the best) highlighted."""
    t = overview_table(report)
    fams = report.ranking.families
    devices = report.ranking.devices
    text = [h in TEXT_COLUMNS for h in t.headers]
    head = []
    for i, h in enumerate(t.headers):
        cls = ' class="t"' if text[i] else ""
        head.append(f'<th{cls} data-sort="{i}">{escape(h)}</th>')
        if h == "configuration":
            head.append(
                '<th class="t" title="throughput against devices (log2), dashed: '
                'linear ideal from one device">curve</th>'
            )
    rows = []
    for k, (row, fam) in enumerate(zip(t.rows, fams, strict=True)):
        cells = []
        for v, left, h in zip(row, text, t.headers, strict=True):
            cells.append(f'<td class="t">{escape(v)}</td>' if left else f"<td>{escape(v)}</td>")
            if h == "configuration":
                cells.append(f'<td class="t">{sparkline(fam, devices)}</td>')
        best = ' class="best"' if k == 0 and fam.eligible else ""
        rows.append(f"<tr{best}>{''.join(cells)}</tr>")
    n = len(t.rows)
    return (
        '<div class="filter"><input type="search" id="overview-filter" '
        'placeholder="filter, e.g. fp32 local_sgd p4" aria-label="filter the configurations"> '
        f'<span id="overview-count">{n} of {n} shown</span> (click a header to sort)</div>'
        '<div class="ovwrap"><table id="overview-table" class="sortable">'
        f"<thead><tr>{''.join(head)}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def sparkline(fam: Family, devices: list[int], width: int = 72, height: int = 20) -> str:
    """The family's measured throughput against devices (log2 x over the sweep's device
    counts, y from 0 to the row's largest value) with the linear ideal from its 1-device run,
    dashed; blank where fewer than one ok point."""
    pts = [(c.devices, c.throughput.median) for c in fam.configs if c.ok]
    if not pts:
        return ""
    x1 = next((x for p, x in pts if p == 1), None)
    ideal = [(p, p * x1) for p in devices if p >= 1] if x1 else []
    top = max(y for _, y in pts + ideal) or 1.0
    lo, hi = math.log2(min(devices)), math.log2(max(devices))
    span = hi - lo or 1.0

    def xy(p: float, y: float) -> str:
        x = 2 + (math.log2(p) - lo) / span * (width - 4)
        return f"{x:.1f},{height - 2 - y / top * (height - 4):.1f}"

    title = ", ".join(f"d{p}: {y:,.0f}" for p, y in pts) + " samples/s"
    parts = [
        f'<svg class="spark" width="{width}" height="{height}" role="img">',
        f"<title>{escape(title)}</title>",
    ]
    if ideal:
        line = " ".join(xy(p, y) for p, y in ideal)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="#999" stroke-dasharray="3 2"/>'
        )
    if len(pts) > 1:
        line = " ".join(xy(p, y) for p, y in pts)
        parts.append(
            f'<polyline class="data" points="{line}" fill="none" stroke="#1f77b4" '
            'stroke-width="1.5"/>'
        )
    for p, y in pts:
        x, yy = xy(p, y).split(",")
        parts.append(f'<circle class="data" cx="{x}" cy="{yy}" r="1.8" fill="#1f77b4"/>')
    return "".join(parts) + "</svg>"


def details(summary: str, body: str, open_: bool = False) -> str:
    """`body` under a collapsible `summary` (HTML already escaped by the caller)."""
    return f"<details{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


def family_summary(rank: int, fam: Family | None, title: str, describe) -> str:
    """A scaling table's summary line: rank, label, best value and where, efficiency."""
    text = f"<b>#{rank}</b> {escape(title)}"
    if fam is not None and fam.best is not None:
        text += f": best {escape(describe(fam.value))} at d{fam.best.devices}"
        eff = fam.efficiency
        if eff:
            text += f", efficiency {eff[1]:.0%} at d{eff[0]}"
    return text


def long_table_summary(t: Table, section_title: str) -> str:
    return f"{escape(t.title or section_title)}: {len(t.rows)} rows"
