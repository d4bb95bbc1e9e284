"""What a search ranks configurations by and what it refuses: a results row's objective (higher
is better: `objective_value`) and its description in words (`describe`), and the constraints a
row must meet (`Constraint`). The report ranks finished sweeps with the same functions
(report/ranking.py). Pure: no Ray, no torch.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amdahl.spec.search_section import CONSTRAINT_PATTERN

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Constraint:
    column: str
    op: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> Constraint:
        m = CONSTRAINT_PATTERN.match(text)
        if not m:  # spec.SearchSpec validated it
            raise ValueError(f"not a constraint: {text!r}")
        return cls(m.group(1), m.group(2), float(m.group(3)))

    def violation(self, row: dict[str, Any]) -> str | None:
        """Why `row` breaks this constraint, or None when it meets it."""
        value = row.get(self.column)
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return f"{self.column} not measured (constraint {self})"
        if _OPS[self.op](float(value), self.bound):
            return None
        return f"{self.column} {value:.4g} breaks the constraint {self}"

    def __str__(self) -> str:
        return f"{self.column} {self.op} {self.bound:g}"


def objective_value(row: dict[str, Any], objective: str) -> float | None:
    """The row's objective, higher is better; None when the row does not give it."""
    throughput = row.get("throughput")
    if objective == "time_to_target":
        t = row.get("time_to_target_s")
        return 1.0 / t if t else None
    if not throughput or not math.isfinite(throughput):
        return None
    if objective == "throughput_per_device":
        return throughput / max(1, int(row.get("devices") or 1))
    return throughput


def describe(value: float, objective: str) -> str:
    if objective == "time_to_target":
        return f"{1 / value:.3g} s to target"
    unit = "samples/s per device" if objective == "throughput_per_device" else "samples/s"
    return f"{value:,.0f} {unit}"
