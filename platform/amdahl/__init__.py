"""amdahl: sweep PyTorch training configurations on Ray and explain the speedup against ideal.

The public Python API. Every name but `Workload` and `UserError` loads on first use: a Ray
worker's `from amdahl import Workload` must not load the planner and the report stack, and
heavy modules (ray, torch, mlflow) load only when first used, so `platform --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from amdahl.errors import UserError
from amdahl.workload import Workload

#: Public name -> the module that defines it (imported when the name is first used).
_LAZY = {
    "COLUMNS": "amdahl.columns",
    "read_results": "amdahl.sweepdir.table",
    "SweepPlan": "amdahl.plan.launches",
    "Trial": "amdahl.plan.trials",
    "plan_sweep": "amdahl.plan.launches",
    "build_report": "amdahl.report",
    "write_reports": "amdahl.report",
    "SweepSpec": "amdahl.spec.schema",
    "load_spec": "amdahl.spec.load",
    "validate_spec": "amdahl.spec.load",
    "run_sweep": "amdahl.driver.sweep",
    "plan_for": "amdahl.driver.planning",
    "plan_summary": "amdahl.sweepdir.driver_files",
    "SweepInterrupted": "amdahl.driver.signals",
    "latest_sweep_dir": "amdahl.sweepdir.layout",
    "predict_sweep": "amdahl.report.predict",
    "comparison": "amdahl.report.comparison",
    "run_calibration": "amdahl.driver.calibrate",
    "PushOutcome": "amdahl.track.push",
    "push_results": "amdahl.track.push",
    "convert_fashion_mnist": "amdahl.data.fashion_mnist",
    # A sync strategy as the trials run it (the report's Ray Train script uses the parameter
    # server's: amdahl's own, with no torch equivalent).
    "make_strategy": "amdahl.worker.sync",
    # The user's workload and the rows a sweep of it read (the Ray Train script's).
    "make_workload": "amdahl.workload.code",
    "train_rows": "amdahl.data.prepare",
}

__all__ = [
    "COLUMNS",
    "PushOutcome",
    "SweepInterrupted",
    "SweepPlan",
    "SweepSpec",
    "Trial",
    "UserError",
    "Workload",
    "build_report",
    "comparison",
    "convert_fashion_mnist",
    "latest_sweep_dir",
    "load_spec",
    "make_strategy",
    "make_workload",
    "plan_for",
    "plan_summary",
    "plan_sweep",
    "predict_sweep",
    "push_results",
    "read_results",
    "run_calibration",
    "run_sweep",
    "train_rows",
    "validate_spec",
    "write_reports",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'amdahl' has no attribute {name!r}")
