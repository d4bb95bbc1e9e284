"""Speedup-vs-ideal report: pure functions over the results table, then renderers.

    build_report(dir)     -> Report (build.py; numbers: analysis/; bottlenecks: diagnose.py and
                             bottleneck.py; the recommendation: recommend.py)
    write_reports(dir)    -> {"markdown": dir/report.md, "html": dir/report.html, and
                             "best": dir/best.yaml when a configuration is recommended (best.py)}
    predict_sweep(dir, devices) -> the step-time model's predictions (predict.py)
    comparison(reports)   -> the side-by-side section of several sweeps (comparison.py)

The report is a neutral document (document.py) of sections (sections.py, model_sections.py)
that render_text.py and render_html.py format; `platform predict` prints
prediction_document.py's.

Inputs: results.parquet, plus calibration.json, spec.yaml and plan.json when present.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from pathlib import Path

from amdahl.files import write_private
from amdahl.report.best import best_markdown, write_best
from amdahl.report.build import Report, build_report, report_from_rows
from amdahl.report.comparison import comparison
from amdahl.report.predict import predict_sweep
from amdahl.report.render_html import to_html
from amdahl.report.render_text import to_markdown
from amdahl.sweepdir.layout import SweepDir

__all__ = [
    "Report",
    "build_report",
    "comparison",
    "predict_sweep",
    "report_from_rows",
    "write_reports",
]


def write_reports(sweep_dir: str | Path, report: Report | None = None) -> dict[str, Path]:
    """Write report.md and report.html into the sweep directory, and best.yaml (report/best.py)
    where a configuration is recommended; returns their paths (`best` only when written)."""
    d = SweepDir(sweep_dir)
    report = report or build_report(d.path)
    paths = {"markdown": d.report_md, "html": d.report_html}
    best = write_best(d.path, report)
    if best.path is not None:
        paths["best"] = best.path
    # Whole and owner-only: labels carry the sweep's parameters.
    write_private(paths["markdown"], to_markdown(report) + best_markdown(best))
    write_private(paths["html"], to_html(report))
    return paths
