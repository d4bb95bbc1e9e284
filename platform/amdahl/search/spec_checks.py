"""What a sweep's search section asks, checked before anything runs (`check_search`), and the
calibration file `search.calibration` names (`read_calibration`), which the step-time model's
skips read. Pure: no Ray, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amdahl.errors import UserError
from amdahl.spec.schema import SweepSpec


def check_search(spec: SweepSpec) -> None:
    """What the search section asks that the rest of the spec cannot give: refused before
    anything runs (a UserError naming the key and the fix)."""
    unused = sorted(spec.search.model_fields_set - {"method"})
    if spec.search.method == "grid" and unused:
        keys = ", ".join(f"search.{k}" for k in unused)
        raise UserError(
            f"{keys}: only a halving search reads {'it' if len(unused) == 1 else 'them'}, and "
            "search.method is grid (every configuration for train.steps); set "
            "search.method: halving, or remove " + ("it" if len(unused) == 1 else "them")
        )
    if spec.search.objective == "time_to_target" and spec.train.target is None:
        raise UserError(
            "search.objective: time_to_target needs train.target (the metric and value to "
            "reach); set it, or use objective throughput"
        )
    read_calibration(spec)


#: search.calibration's value that measures the calibration in the sweep itself.
AUTO_CALIBRATION = "auto"


def read_calibration(spec: SweepSpec, measured: Path | None = None) -> dict[str, Any] | None:
    """search.calibration's content for the step-time model (relative: to the sweep file);
    for `auto`, the `measured` calibration.json when it is there yet."""
    if not spec.search.calibration:
        return None
    if spec.search.calibration == AUTO_CALIBRATION:
        if measured is None or not measured.exists():
            return None
        path = measured
    else:
        path = Path(spec.search.calibration).expanduser()
    if not path.is_absolute() and spec.source_dir is not None:
        path = spec.source_dir / path
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        content, why = None, f"{type(e).__name__}: {e}"
    else:
        why = "not a JSON object"
    if not isinstance(content, dict):
        raise UserError(
            f"search.calibration: cannot read {path} ({why}); give the calibration.json that "
            "`platform calibrate` wrote, or leave search.calibration out"
        )
    return content
