"""amdahl: sweep PyTorch training configurations on Ray and explain the speedup against ideal.

The public Python API. Heavy modules (ray, torch, mlflow) load only when first used, so
`import amdahl` and `platform --help` stay fast.
"""

from __future__ import annotations

from typing import Any

from amdahl.errors import UserError
from amdahl.plan import SweepPlan, Trial, plan_sweep
from amdahl.report import build_report, write_reports
from amdahl.results import COLUMNS, read_results
from amdahl.spec import SweepSpec, load_spec, validate_spec
from amdahl.workload import Workload

__all__ = [
    "COLUMNS",
    "SweepPlan",
    "SweepSpec",
    "Trial",
    "UserError",
    "Workload",
    "build_report",
    "load_spec",
    "make_plan",
    "plan_sweep",
    "read_results",
    "run_sweep",
    "validate_spec",
    "write_reports",
]


def __getattr__(name: str) -> Any:
    if name in ("run_sweep", "make_plan"):
        from amdahl import run

        return getattr(run, name)
    raise AttributeError(f"module 'amdahl' has no attribute {name!r}")
