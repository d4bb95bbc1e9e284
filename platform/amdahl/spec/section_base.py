"""The base every sweep-file section's model shares (spec.schema, spec.search_section)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys refused (the loader turns them into a "did you mean"), defaults validated.

    allow_inf_nan=False: "inf" and "nan" (strings pydantic would turn into floats) are refused
    like YAML's .inf and .nan (see amdahl.spec.load): no count, rate or price is infinite.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)
