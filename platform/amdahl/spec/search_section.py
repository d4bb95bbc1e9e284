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
from amdahl.spec.section_base import Section

Objective = Literal["throughput", "throughput_per_device", "time_to_target"]
#: A search constraint, COLUMN OP NUMBER (groups: column, operator, number): the one grammar
#: that SearchSpec validates and search/objectives.py parses.
CONSTRAINT_PATTERN = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
_BUDGET = re.compile(r"^\s*([0-9.]+)\s*(%|s)?\s*$")


class SearchSpec(Section):
    """How the grid's configurations are searched: all of them for `train.steps`, or
    successive halving (search/halving.py)."""

    method: Literal["grid", "halving"] = Field(
        "grid",
        description="grid: every configuration for `train.steps`; halving: successive "
        "halving (see [Searching instead of the whole grid](searching.md)).",
    )
    budget: float | str | None = Field(
        None,
        description="halving: the most trial-seconds to spend, or a share of the whole "
        "grid's estimated trial-seconds.",
        json_schema_extra={"shown_type": "seconds, `'600s'`, `'25%'`, or null"},
    )
    eta: int = Field(3, ge=2, description="halving: keep the best 1/eta of each rung.")
    min_steps: int = Field(
        10,
        ge=1,
        description="halving: measured steps of the first rung (x eta per rung; the last "
        "rung runs `train.steps`, and a rung within sqrt(eta) of it is left out: 300 steps "
        "give rungs 10, 30, 90, 300).",
    )
    final_repeats: int = Field(
        1,
        ge=1,
        description="halving: measurements of each finalist in the last rung, interleaved "
        "in one launch; the ranking takes their median, and the summary and report name the "
        "finalists whose spread cannot be told apart from the best (3 on a noisy machine).",
    )
    objective: Objective = Field(
        "throughput",
        description="what is best (`time_to_target` needs `train.target`).",
    )
    constraints: list[str] = Field(
        [],
        description="conditions a configuration must meet, e.g. `'peak_mem_bytes <= 4e9'`, "
        "`'val_accuracy >= 0.8'`.",
        json_schema_extra={"shown_type": "list of `COLUMN OP NUMBER`"},
    )
    skip_below: float | None = Field(
        0.5,
        gt=0,
        le=1,
        description="halving: skip (and record as `skipped`) a configuration whose predicted "
        "objective is below this share of the best measured one even at the high end of the "
        "step-time model's 80% interval; null: never.",
    )
    continue_rungs: bool = Field(
        True,
        description="halving: a promoted configuration continues its trial from the rung "
        "before (kept in its workers: only the added steps run, set-up and warmup once; the "
        "row pools the windows and says so in `windows` and `continued_from`) instead of "
        "starting again; eager trials only (not the parameter server; a compiled "
        "configuration starts fresh but loads its own compiled graphs, "
        "`options.compile_cache`), within a quarter of each worker's memory; a configuration "
        "that cannot continue starts fresh and `restart_reason` says why.",
    )
    calibration: str | None = Field(
        None,
        description="a `calibration.json` from `platform calibrate`, giving the model its "
        "communication terms; `auto` measures it in the sweep's live worker group with the "
        "most workers, after the first rung's anchors and before its other configurations, "
        "into the sweep directory (seconds, no worker group of its own; a resume reuses it); "
        "without one, only `sync: none` families and 1-device trials are predicted.",
        json_schema_extra={"shown_type": "path, `auto` or null"},
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
