"""`platform report A B ...`'s side-by-side section: the configurations the first sweep shares
with each other one, their throughput beside each other and whether they differ measurably.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from amdahl.analysis.stats import differs
from amdahl.report.build import Report
from amdahl.report.document import Section, Table, rate, spread


def comparison(reports: list[Report]) -> Section:
    """Configurations present in the first sweep and another, throughput side by side."""
    first = reports[0]
    sec = Section("comparison", "Side by side: " + " vs ".join(r.name for r in reports))
    others = [{c.key: c for c in r.configs if c.ok} for r in reports[1:]]
    rows = []
    for c in first.configs:
        if not c.ok:
            continue
        row = [c.label, f"{rate(c.throughput.median)} {spread(c.throughput)}"]
        matched = False
        for other in others:
            o = other.get(c.key)
            if o is None:
                row += ["", ""]
                continue
            matched = True
            verdict = (
                f"{o.throughput.median / c.throughput.median:.2f}x"
                if differs(o.throughput, c.throughput)
                else "no measurable difference"
            )
            row += [f"{rate(o.throughput.median)} {spread(o.throughput)}", verdict]
        if matched:
            rows.append(row)
    headers = ["configuration", f"{first.name} samples/s"]
    for r in reports[1:]:
        headers += [f"{r.name} samples/s", "vs first"]
    if rows:
        sec.tables.append(Table(headers, rows))
    else:
        sec.paras.append("The sweeps share no configuration.")
    return sec
