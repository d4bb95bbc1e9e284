"""The descriptions MLflow's UI shows above an experiment and a run (the `mlflow.note.content`
tag, Markdown): the experiment's names the sweep file and how to read its runs
(`experiment_note`); a sweep's parent run carries the report's recommendation and headline
figures (`sweep_note`), set when the sweep ends and by `platform mlflow-push`.

Apart from the tracker because these are the report's words: the note is rendered from the
report's own sections (`report.sections`) with its own Markdown functions, so the run's
description and report.md say the same thing.
"""

from __future__ import annotations

from typing import Any

from amdahl.report.build import Report
from amdahl.report.document import Section, pct, times
from amdahl.report.render_text import markdown_table, md_block, md_escape
from amdahl.report.sections import sections
from amdahl.track.child_run import CONFIG_TAG

#: MLflow's longest tag value; a longer note is cut at a line and says so.
MAX_NOTE = 8000
#: Scaling curves the note lists (report.md has them all).
_MAX_CURVES = 10


def experiment_note(spec: Any) -> str:
    """The description of an experiment amdahl creates (or one without any): which sweep file
    fills it and how its runs are laid out."""
    source = f"`{md_escape(str(spec.source_file))}`" if spec.source_file else "a Python program"
    return (
        f"Sweeps of {source} (sweep {md_escape(spec.name)}, workload "
        f"{md_escape(spec.workload)}), mirrored by amdahl. Each sweep is a parent run named "
        "after its sweep directory, holding the report and the results table; its child runs "
        "are the trial repeats. Group the runs by the tag "
        f"`{CONFIG_TAG}` to see each configuration's repeats (min, mean, max); numeric "
        "settings are metrics too, so `metrics.devices >= 2` filters."
    )


def sweep_note(report: Report) -> str:
    """The sweep's parent-run description: the report's recommendation (headline and picks),
    each scaling curve's speedup and efficiency at its most devices, and the report's summary,
    at most MAX_NOTE characters."""
    by_key = {s.key: s for s in sections(report)}
    out: list[str] = []
    if "recommendation" in by_key:
        out += _section(by_key["recommendation"], with_title=False)
    scaling = [_curve_line(c) for c in report.curves[:_MAX_CURVES]]
    if scaling:
        out.append("**Scaling** (at each curve's most devices):\n")
        out += [f"- {line}" for line in scaling if line]
        if len(report.curves) > _MAX_CURVES:
            out.append(f"- ... and {len(report.curves) - _MAX_CURVES} more curves in report.md")
        out.append("")
    if "summary" in by_key:
        out += _section(by_key["summary"], with_title=False)
    out.append("The full report is in this run's artifacts: report.md and report.html.")
    return _cut("\n".join(out).strip() + "\n")


def _section(sec: Section, with_title: bool = True) -> list[str]:
    out = [f"### {md_escape(sec.title)}\n"] if with_title else []
    out += [md_block(p) + "\n" for p in sec.paras]
    out += [markdown_table(t) for t in sec.tables]
    out += [f"- {md_block(b)}" for b in sec.bullets]
    return out + ([""] if sec.bullets else [])


def _curve_line(curve: Any) -> str:
    point = curve.points[-1]
    if point.speedup is None:
        return f"{md_escape(curve.label)}: no 1-device run, so no speedup"
    return (
        f"{md_escape(curve.label)}: speedup {times(point.speedup.median)} at "
        f"{point.devices} devices, efficiency {pct(point.efficiency)}"
    )


def _cut(text: str) -> str:
    if len(text) <= MAX_NOTE:
        return text
    tail = "\n\n... (cut: the full report is report.md in this run's artifacts)\n"
    head = text[: MAX_NOTE - len(tail)]
    return head[: head.rfind("\n") + 1 or len(head)] + tail
