"""The terminal's short view, `platform report`'s default: the answer first (the recommendation),
the top configurations of the overview, the best one's scaling, and a closing list of what it
left out and where that is (report.md, report.html, `platform report --all`). A sweep of any
size fits on a screen or two; report.md/html stay complete.

The left-out list is made from the full document's own sections (sections.py), so a section
added there is named here without a change.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from amdahl.report.build import Report
from amdahl.report.document import Section, Table, rate, spread
from amdahl.report.overview import overview_table
from amdahl.report.ranking import OBJECTIVE_TEXT
from amdahl.report.sections import curve_table, sections
from amdahl.sweepdir.layout import SweepDir

#: Families the top table shows.
TOP = 10
#: Report notes shown before the rest are counted.
_NOTES = 3
#: Sections the short view shows in full or in part (the rest are named as left out).
_SHOWN = ("summary", "recommendation")


def brief_sections(report: Report, top: int = TOP) -> list[Section]:
    if report.configs and not any(c.ok for c in report.configs):
        return sections(report)  # the failures are the whole report: shown in full
    out = [_heading(report), _answer(report)]
    fams = report.ranking.families
    if fams:
        title = (
            f"Top {min(top, len(fams))} of {len(fams)} configurations by "
            f"{OBJECTIVE_TEXT[report.ranking.objective]}"
        )
        out.append(Section("top", title, tables=[_narrow(overview_table(report, top), report)]))
    curve = fams[0].curve if fams else None
    if curve is not None and len(curve.points) > 1:
        table = curve_table(curve)
        # The section's title names the curve, so its notes and table need not.
        table.title = ""
        table.notes = [n.removeprefix(f"{curve.label}: ") for n in table.notes]
        out.append(Section("best", f"Scaling of the best: {fams[0].label}", tables=[table]))
    out.append(_left_out(report, top, shown_curve=curve is not None and len(curve.points) > 1))
    return out


def _narrow(t: Table, r: Report) -> Table:
    """The overview's rows as a terminal reads them: device columns headed `d2` (the title
    says samples/s), the best and where left out when the device columns already show them
    (throughput), the status when every row shown is ok."""
    drop = set()
    if r.ranking.objective == "throughput":
        drop |= {t.headers.index("at"), len(t.headers) - 5}  # the best value and where
    status = t.headers.index("status")
    if all(row[status] == "ok" for row in t.rows):
        drop.add(status)
    keep = [i for i in range(len(t.headers)) if i not in drop]
    headers = [t.headers[i].removesuffix(" samples/s") for i in keep]
    return Table(headers, [[row[i] for i in keep] for row in t.rows], t.title)


def _heading(r: Report) -> Section:
    ok = sum(1 for c in r.configs if c.ok)
    modes = " and ".join(r.scaling_modes) or "unknown"
    sec = Section("summary", f"Sweep {r.name}")
    sec.paras.append(
        f"{r.row_count} result rows, {len(r.configs)} configurations ({ok} with ok runs), up to "
        f"{r.max_repeats} repeat(s) each; {modes} scaling."
    )
    sec.bullets = list(r.notes[:_NOTES])
    if len(r.notes) > _NOTES:
        sec.bullets.append(f"... and {len(r.notes) - _NOTES} more notes (report.md, top)")
    bad: dict[str, int] = {}
    for f in r.failures:
        bad[f.status] = bad.get(f.status, 0) + f.count
    if bad:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(bad.items()))
        sec.bullets.append(f"runs that did not succeed: {counts} (reasons: report.md, Failed)")
    return sec


def _answer(r: Report) -> Section:
    """The recommendation's headline and picks; ties counted rather than listed."""
    rec = r.recommendation
    sec = Section("recommendation", "Recommendation")
    if not rec.picks:
        sec.paras.append("No configuration can be recommended: no ok run qualifies.")
        return sec
    sec.paras.append(rec.headline())
    rows = []
    for p in rec.picks:
        value = f"${p.value.median:,.3g}" if p.unit == "$" else f"{rate(p.value.median)} {p.unit}"
        tie = f"{len(p.ties)} not measurably different" if p.ties else ""
        rows.append([p.goal, p.config.label, value, spread(p.value), tie])
    sec.tables.append(Table(["best by", "configuration", "value", "spread", "note"], rows))
    return sec


def _left_out(r: Report, top: int, shown_curve: bool) -> Section:
    """Every section of the full report this view did not print, or printed in part."""
    fams = len(r.ranking.families)
    out = []
    for sec in sections(r):
        if sec.key in _SHOWN:
            continue
        if sec.key == "overview":
            if fams > top:
                out.append(f"Overview: {fams - top} more configurations, ranked")
        elif sec.key == "scaling":
            rest = len(r.curves) - int(shown_curve)
            if rest:
                out.append(f"{sec.title}: {rest} more curve(s), with fits and projections")
        else:
            rows = sum(len(t.rows) for t in sec.tables)
            out.append(sec.title + (f" ({rows} row{'s' if rows > 1 else ''})" if rows else ""))
    if r.recommendation.pareto or r.recommendation.excluded:
        out.insert(0, "Recommendation: the Pareto front and the configurations not recommended")
    sec = Section("left_out", "Not shown here", bullets=out)
    if r.sweep_dir is not None:
        d = SweepDir(r.sweep_dir)
        where = f"{d.report_md} and {d.report_html}"
        again = f"`platform report --all {r.sweep_dir}`"
    else:
        where, again = "report.md and report.html (amdahl.write_reports)", "print_report(full=True)"
    sec.paras.append(
        f"All of it, in the same order: {where} (the HTML overview sorts and filters), or "
        f"{again} to print everything here."
    )
    return sec
