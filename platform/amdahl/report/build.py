"""One sweep's report as data: every number the renderers print or plot, computed once here
(the step-time model's fit included), so the sections and renderers only read it.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amdahl.analysis.calibration import Calibration
from amdahl.analysis.configs import Config, group_configs
from amdahl.analysis.memory_view import MemoryView
from amdahl.analysis.scaling import Curve, scaling_curves
from amdahl.report.diagnose import (
    BatchLimit,
    Diagnosis,
    Failure,
    batch_limits,
    compile_findings,
    diagnose,
    failures,
)
from amdahl.report.inputs import SweepInputs, load_inputs
from amdahl.report.predict import PredictedView, fit_view, model_inputs
from amdahl.report.ranking import Ranking, rank, sweep_objective
from amdahl.report.recommend import QualityCheck, Recommendation, check_quality, recommend

if TYPE_CHECKING:
    from amdahl.search.halving import SearchState


@dataclass
class Report:
    name: str
    sweep_dir: Path | None
    row_count: int
    configs: list[Config]
    curves: list[Curve]
    diagnoses: list[Diagnosis]
    quality: dict[tuple, QualityCheck]
    recommendation: Recommendation
    failures: list[Failure]
    batch_limits: list[BatchLimit]
    compile_notes: list[str]
    #: The step-time model fitted to this sweep, and its leave-one-out check.
    predicted: PredictedView
    calibration: Calibration | None = None
    price: float = 0.0
    notes: list[str] = field(default_factory=list)
    #: search: halving: the rungs replayed from the rows, and plan.json's trial labels.
    search: SearchState | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: spec.yaml and plan.json's resources as read (report/best.py's best.yaml), or None.
    spec: dict[str, Any] | None = None
    planned_resources: dict[str, Any] | None = None
    #: plan.json's memory probe facts, the device's size and the overhead the rows show.
    memory: MemoryView = field(default_factory=MemoryView)
    #: Families ranked by the sweep's objective (ranking.py); curves and diagnoses follow it.
    ranking: Ranking = field(default_factory=lambda: Ranking("throughput"))

    @property
    def scaling_modes(self) -> list[str]:
        return sorted({c.scaling for c in self.configs})

    @property
    def max_repeats(self) -> int:
        return max((len(c.ok_rows) for c in self.configs), default=0)


def build_report(sweep_dir: str | Path) -> Report:
    """Read a sweep directory and compute its report."""
    return assemble(load_inputs(sweep_dir))


def assemble(inputs: SweepInputs) -> Report:
    """The report from already-loaded inputs (tests build these by hand)."""
    configs = group_configs(inputs.rows)
    quality = check_quality(configs)
    memory = inputs.memory
    report = Report(
        name=inputs.name,
        sweep_dir=inputs.sweep_dir,
        row_count=len(inputs.rows),
        configs=configs,
        curves=scaling_curves(configs),
        diagnoses=diagnose(configs, inputs.calibration, memory),
        quality=quality,
        recommendation=recommend(configs, quality, inputs.price_per_device_hour),
        failures=failures(configs, inputs.refused),
        batch_limits=batch_limits(configs),
        compile_notes=compile_findings(configs),
        predicted=fit_view(model_inputs(inputs, configs)),
        calibration=inputs.calibration,
        price=inputs.price_per_device_hour,
        notes=list(inputs.notes),
        search=inputs.search,
        labels=dict(inputs.labels),
        spec=inputs.spec,
        planned_resources=inputs.planned_resources,
        memory=memory,
    )
    objective = sweep_objective(inputs.spec, inputs.rows)
    ranking = rank(configs, report.curves, report.recommendation.eligible, objective)
    report.ranking = ranking
    report.curves.sort(key=lambda cv: ranking.position(cv.points[0].config))
    report.diagnoses.sort(key=lambda d: ranking.position(d.config))
    if report.configs and report.max_repeats <= 1:
        report.notes.append(
            "one repeat per configuration: spreads are unknown, so every difference is taken "
            "at face value; set train.repeats >= 3 to tell noise from real differences"
        )
    short = short_noisy_windows(configs)
    if short:
        report.notes.append(short)
    if len(report.scaling_modes) > 1:
        report.notes.append("this table mixes weak and strong scaling rows; curves keep them apart")
    return report


#: A configuration whose repeats' throughput varies by more than this (coefficient of
#: variation) over windows shorter than SHORT_WINDOW_S is measured too briefly to rank on.
NOISY_CV, SHORT_WINDOW_S = 0.10, 1.0


def short_noisy_windows(configs: list[Config]) -> str | None:
    """The note for configurations whose repeats disagree over windows too short to average
    the machine's noise out (on 16 idle cores, 100-step windows of 0.1-0.4 s varied by a CV of
    24% where the same sweep's longer ones varied by 1-5%), or None."""
    hit = []
    for c in configs:
        thr, window = c.throughput, c.stat("measured_s")
        if thr and window and thr.n > 1 and thr.cv > NOISY_CV and window.median < SHORT_WINDOW_S:
            hit.append((c, thr.cv, window.median))
    if not hit:
        return None
    worst = max(hit, key=lambda h: h[1])
    return (
        f"{len(hit)} configuration(s) varied by a CV over {NOISY_CV:.0%} between repeats with "
        f"measured windows under {SHORT_WINDOW_S:.0f} s (worst: {worst[0].label}, CV "
        f"{worst[1]:.0%} over {worst[2]:.2f} s windows): too short to rank on; raise "
        "train.steps so that each window lasts a few seconds"
    )


def report_from_rows(
    rows: list[dict[str, Any]],
    name: str = "sweep",
    calibration: dict[str, Any] | None = None,
    price: float = 0.0,
    refused: list[tuple[str, str]] | None = None,
) -> Report:
    """Convenience for the Python API and tests: a report from plain rows."""
    return assemble(
        SweepInputs(
            sweep_dir=None,
            name=name,
            rows=rows,
            calibration=Calibration.from_dict(calibration) if calibration else None,
            price_per_device_hour=price,
            refused=list(refused or []),
        )
    )
