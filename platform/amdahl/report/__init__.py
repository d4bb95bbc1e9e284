"""Speedup-vs-ideal report: pure functions over the results table, then renderers.

    build_report(dir)     -> Report (numbers: compute.py; bottlenecks, recommendation: diagnose.py)
    write_reports(dir)    -> {"markdown": dir/report.md, "html": dir/report.html}
    predict_sweep(dir, devices) -> the step-time model's predictions (stepmodel.py)

Inputs: results.parquet, plus calibration.json, spec.yaml and plan.json when present.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from pathlib import Path

from amdahl.files import write_private
from amdahl.report.build import Report, build_report, report_from_rows
from amdahl.report.document import comparison
from amdahl.report.predict import predict_sweep
from amdahl.report.render_html import to_html
from amdahl.report.render_text import to_markdown
from amdahl.sweepdir.layout import REPORT_HTML_FILE, REPORT_MD_FILE, SweepDir

#: The report files' names (sweepdir.py holds every file name of a sweep directory).
MARKDOWN_FILE = REPORT_MD_FILE
HTML_FILE = REPORT_HTML_FILE

__all__ = [
    "HTML_FILE",
    "MARKDOWN_FILE",
    "Report",
    "build_report",
    "comparison",
    "predict_sweep",
    "report_from_rows",
    "write_reports",
]


def write_reports(sweep_dir: str | Path, report: Report | None = None) -> dict[str, Path]:
    """Write report.md and report.html into the sweep directory; returns their paths."""
    d = SweepDir(sweep_dir)
    report = report or build_report(d.path)
    paths = {"markdown": d.report_md, "html": d.report_html}
    _write(paths["markdown"], to_markdown(report))
    _write(paths["html"], to_html(report))
    return paths


def _write(path: Path, text: str) -> None:
    write_private(path, text)  # whole, owner-only: labels carry the sweep's parameters
