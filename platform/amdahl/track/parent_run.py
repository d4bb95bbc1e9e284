"""What the sweep's parent run carries in the tracking store: the sweep's spec as params
(`spec_params`) and its figures: the scaling curves and the best configuration, from the
report's own numbers (`scaling_metrics`), under metric names MLflow accepts (`metric_names`).

Apart from the tracker's mechanism (`track/tracker.py`, which decides when they are logged and
records what the parent holds) because these are the report's figures, shaped for MLflow's
charts: a metric history per configuration with step = the device count.
"""

from __future__ import annotations

import re
from typing import Any

from amdahl.spec.schema import SweepSpec
from amdahl.track.records import is_metric_value

#: Characters a metric name may not hold (MLflow allows letters, digits, `_ - . /`, space, and
#: colons except on Windows; `/` is kept for the figure's prefix alone).
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.\- ]+")


def spec_params(spec: SweepSpec) -> dict[str, str]:
    """The sweep's spec as the parent run's params: nested sections flattened to dotted names
    (`tracking.uri`), each value at most 6000 characters."""
    return {k: str(v)[:6000] for k, v in _flatten(spec.model_dump()).items()}


def scaling_metrics(
    rows: list[dict[str, Any]],
) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """The parent run's figures, from the report's own numbers (analysis/compute.py): per scaling
    curve (a configuration: every setting but devices), `throughput/<curve>` (samples/s),
    `speedup/<curve>` and `efficiency/<curve>` at step = the device count, so MLflow charts
    them against devices; and the report's fastest configuration as `best/throughput`,
    `best/devices`, `best/speedup`, `best/efficiency` (step 0), its label in the tag
    `amdahl.best`. `<curve>` is the report's label of the curve (`b256 fp32 eager w1 ddp`), its
    characters MLflow refuses in a name made `_` (`metric_names`).

    Returns ([(key, value, step)], tags); empty when no configuration ran ok."""
    from amdahl.report.build import report_from_rows

    report = report_from_rows(rows)
    metrics: list[tuple[str, float, int]] = []
    points: dict[tuple, Any] = {}
    names = metric_names([c.label for c in report.curves])
    for curve, name in zip(report.curves, names, strict=True):
        for point in curve.points:
            points[point.config.key] = point
            figures = {
                "throughput": point.config.throughput.median,
                "speedup": point.speedup.median if point.speedup else None,
                "efficiency": point.efficiency,
            }
            metrics += [
                (f"{figure}/{name}", float(value), point.devices)
                for figure, value in figures.items()
                if is_metric_value(value)
            ]
    tags: dict[str, str] = {}
    if report.recommendation.picks:
        best = report.recommendation.picks[0].config  # the fastest: the report's first pick
        point = points.get(best.key)
        figures = {
            "throughput": best.throughput.median,
            "devices": best.devices,
            "speedup": point.speedup.median if point and point.speedup else None,
            "efficiency": point.efficiency if point else None,
        }
        metrics += [
            (f"best/{figure}", float(value), 0)
            for figure, value in figures.items()
            if is_metric_value(value)
        ]
        tags["amdahl.best"] = best.label
    return metrics, tags


def metric_names(labels: list[str], limit: int = 200) -> list[str]:
    """Each label as the part of a metric name after its figure's `/`: characters MLflow
    refuses (and `/`) become `_`, at most `limit` characters, a `-2`, `-3`... suffix where two
    would be equal."""
    out: list[str] = []
    for label in labels:
        base = _NOT_IN_NAME.sub("_", label).strip()[:limit].strip()
        base = "all" if base in ("", ".", "..") else base  # not a path segment of its own
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
