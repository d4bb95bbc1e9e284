"""The overview: one row per family (ranking.py), best first, so a sweep of any size can be
compared side by side: its throughput at each device count, its best objective value and where,
its scaling efficiency, the bottleneck of its best configuration and how its runs ended.

report.md and report.html print every row (the HTML one sortable and filterable in the page,
render_html.py); the terminal's short view (brief.py) prints the first few.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from amdahl.report.build import Report
from amdahl.report.document import Section, Table, pct, rate
from amdahl.report.ranking import OBJECTIVE_TEXT, Family, config_status

#: The best column's header and how its value is written, per objective (value: higher is
#: better, as search.objectives.objective_value gives it).
_BEST = {
    "throughput": ("best samples/s", rate),
    "throughput_per_device": ("best samples/s/device", rate),
    "time_to_target": ("best s to target", lambda v: f"{1 / v:.3g}"),
}


def overview_table(report: Report, limit: int | None = None) -> Table:
    """Every family (or the first `limit`) as the overview's rows, ranked."""
    ranking = report.ranking
    devices = ranking.devices
    header, fmt = _BEST[ranking.objective]
    bottleneck = {d.config.key: d.bottleneck for d in report.diagnoses}
    rows = []
    for i, fam in enumerate(ranking.families[:limit]):
        eff = fam.efficiency
        status = fam.status
        if fam.value is not None and not fam.eligible:
            status += "; not recommendable"
        rows.append(
            [
                str(i + 1),
                fam.label,
                *(_at(fam, p) for p in devices),
                fmt(fam.value) if fam.value is not None else "n/a",
                f"d{fam.best.devices}" if fam.best else "",
                f"{pct(eff[1])} at d{eff[0]}" if eff else "",
                bottleneck.get(fam.best.key, "") if fam.best else "",
                status,
            ]
        )
    return Table(
        [
            "#",
            "configuration",
            *(f"d{p} samples/s" for p in devices),
            header,
            "at",
            "efficiency",
            "bottleneck",
            "status",
        ],
        rows,
    )


def _at(fam: Family, devices: int) -> str:
    """Throughput at `devices` (median over ok repeats), how its runs ended, or blank."""
    c = fam.at(devices)
    if c is None:
        return ""
    if c.ok:
        return rate(c.throughput.median)
    return config_status(c)


def overview_section(report: Report) -> Section:
    ranking = report.ranking
    fams = ranking.families
    points = sum(len(f.configs) for f in fams)
    sec = Section("overview", "Overview: every configuration, best first")
    if not fams:
        sec.paras.append("No configurations: nothing to rank.")
        return sec
    sec.paras.append(
        f"{len(fams)} configurations across device counts ({points} measured grid points), "
        f"ranked by {OBJECTIVE_TEXT[ranking.objective]}. A row's best is among the "
        "configurations the recommendation may pick (sync none on more than one device is the "
        "no-communication ceiling, not a way to train); efficiency = speedup / p at the "
        "largest device count; bottleneck: of the best configuration (Where the time went). "
        "The sections below follow the same order."
    )
    sec.tables.append(overview_table(report))
    return sec
