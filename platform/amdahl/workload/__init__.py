"""A user's workload: the API they subclass (`api`), finding their code and shipping it to Ray
workers (`code`), and the plan-time checks of its data path (`data_checks`).

The names below are the public ones (`from amdahl import Workload`; from Python,
`amdahl.workload.locate_spec_workload(spec).runtime_env()` for a Ray you start yourself).
Importing this package loads neither torch nor the planner: a Ray worker imports it.
"""

from amdahl.workload.api import REQUIRED, Workload
from amdahl.workload.code import (
    REGISTERED,
    WorkloadCode,
    locate_spec_workload,
    locate_workload,
    make_workload,
    resolve_workload,
    workload_search_path,
)
from amdahl.workload.data_checks import check_workload

__all__ = [
    "REGISTERED",
    "REQUIRED",
    "Workload",
    "WorkloadCode",
    "check_workload",
    "locate_spec_workload",
    "locate_workload",
    "make_workload",
    "resolve_workload",
    "workload_search_path",
]
