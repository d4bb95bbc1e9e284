"""The sweep file's `search` section: how the grid's configurations are searched.

Its own module beside spec.schema (which holds it as SweepSpec.search) because the search's
rules are long: the budget's grammar, the constraints' grammar that search/objectives.py also
parses, and each field's meaning as docs/sweep-file.md prints it. Pure: pydantic only.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from amdahl.columns import COLUMNS
from amdahl.spec.sections import Section

Objective = Literal["throughput", "throughput_per_device", "time_to_target"]
#: A search constraint, COLUMN OP NUMBER (groups: column, operator, number): the one grammar
#: that SearchSpec validates and search/objectives.py parses.
CONSTRAINT_PATTERN = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
_BUDGET = re.compile(r"^\s*([0-9.]+)\s*(%|s)?\s*$")


class SearchSpec(Section):
    """How the grid's configurations are searched (search/halving.py; docs/architecture.md,
    "Search")."""

    method: Literal["grid", "halving"] = Field(
        "grid",
        description="grid: measure every configuration for train.steps; halving: successive "
        "halving, short windows for all, longer ones for the best 1/eta of each rung.",
    )
    budget: float | str | None = Field(
        None,
        description="halving: most trial-seconds to spend, as seconds (600 or '600s') or as a "
        "share of the whole grid's estimated trial-seconds ('25%'); null: no limit.",
    )
    eta: int = Field(3, ge=2, description="halving: keep the best 1/eta of each rung.")
    min_steps: int = Field(
        10, ge=1, description="halving: measured steps of the first rung (x eta per rung)."
    )
    final_repeats: int = Field(
        1,
        ge=1,
        description="halving: measurements of each finalist in the last rung, interleaved in "
        "one launch; the final ranking is their median, and the finalists whose spread cannot "
        "be told apart from the best are named as such.",
    )
    objective: Objective = Field(
        "throughput",
        description="What is best: throughput (samples/s), throughput_per_device (samples/s "
        "per device: throughput per device-hour), or time_to_target (train.target needed).",
    )
    constraints: list[str] = Field(
        [],
        description="Conditions on a row's columns a configuration must meet, such as "
        "'peak_mem_bytes <= 4e9' or 'val_accuracy >= 0.8' (<=, >=, <, >).",
    )
    skip_below: float | None = Field(
        0.5,
        gt=0,
        le=1,
        description="halving: skip a configuration the step-time model predicts below this "
        "share of the best measured objective (recorded as status skipped); null: never.",
    )
    continue_rungs: bool = Field(
        True,
        description="halving: keep each ranking rung's trials in their workers, so that a "
        "promoted configuration continues where its rung stopped (only the added steps run; "
        "set-up and warmup once; the row pools its windows) instead of starting again; kept "
        "trials hold at most a quarter of a worker's memory. Eager trials only: compiled "
        "(inductor, torchscript) and time_to_target trials start again each rung.",
    )
    calibration: str | None = Field(
        None,
        description="halving: a calibration.json (`platform calibrate`) giving the step-time "
        "model its communication terms, or 'auto': measure it in the sweep's own Ray before the "
        "first rung (into the sweep directory; about 20 s on a laptop). Without one the model "
        "predicts sync none families only.",
    )

    @field_validator("budget")
    @classmethod
    def _budget_seconds_or_share(cls, value: float | str | None) -> float | str | None:
        if value is None:
            return None
        m = _BUDGET.match(str(value))
        if not m or float(m.group(1)) <= 0 or (m.group(2) == "%" and float(m.group(1)) > 100):
            raise ValueError(
                f"got {value!r}: give trial-seconds (600 or '600s') or a share of the grid's "
                "estimated cost ('25%', at most 100%)"
            )
        return value

    @field_validator("constraints")
    @classmethod
    def _constraints_parse(cls, value: list[str]) -> list[str]:
        if not value:
            return value

        for text in value:
            m = CONSTRAINT_PATTERN.match(text)
            if not m:
                raise ValueError(
                    f"got {text!r}: write COLUMN OP NUMBER, e.g. 'peak_mem_bytes <= 4e9' "
                    "(OP one of <=, >=, <, >)"
                )
            column = m.group(1)
            if column not in COLUMNS or not _numeric_column(COLUMNS[column][0]):
                numeric = sorted(k for k, (t, _) in COLUMNS.items() if _numeric_column(t))
                raise ValueError(
                    f"{text!r}: {column!r} is not a numeric results column; one of "
                    + ", ".join(numeric)
                )
        return value

    def budget_s(self, grid_estimate_s: float) -> float | None:
        """The budget in trial-seconds, given the whole grid's estimated trial-seconds."""
        if self.budget is None:
            return None
        m = _BUDGET.match(str(self.budget))
        assert m is not None  # validated
        number = float(m.group(1))
        return number / 100 * grid_estimate_s if m.group(2) == "%" else number


def _numeric_column(typ: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(typ) or pa.types.is_floating(typ)
