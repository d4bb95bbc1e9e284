"""tracking.json, the sweep directory's record of what each tracking store holds: per store
(`MlflowBackend.store_key`) and experiment, the sweep's parent run, the rows it holds (by
`child_run_key`, with their run id, status and the configuration label they are tagged with),
the scaling figures logged on it and a digest of its description.

This record is what makes the mirror idempotent: a resumed sweep or `platform mlflow-push` pushes
only the rows a store lacks, and a sweep directory copied elsewhere is pushed in full to another
store. Reading it (`load_state`, which checks its shape), finding a store's entry
(`store_entry`) and writing it (`write_state`) live here; when to write is the tracker's
(`track/tracker.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amdahl.errors import UserError
from amdahl.files import write_private

#: tracking.json's layout: 2 keys the record by store; a file without `version` is the old,
#: unkeyed one.
STATE_VERSION = 2
#: The fields of a store's entry that hold a string or null.
_STRING_FIELDS = ("store", "experiment", "experiment_id", "parent_run_id")


def load_state(path: Path) -> dict[str, Any]:
    """tracking.json: per tracking store and experiment, the parent run, the rows it holds and
    the scaling figures logged on it.

    A file from before the record was keyed by store (no `version`) becomes one entry of an
    unknown store (`store` null), which `Tracker` matches to a store by its parent run id. A
    file that is not a tracking state is a UserError naming the fix.
    """
    if not path.exists():
        return {"version": STATE_VERSION, "stores": []}
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON object expected, got {type(raw).__name__}")
        if "version" in raw:
            if raw["version"] != STATE_VERSION:
                raise ValueError(f"unknown layout version {raw['version']!r}")
            if not isinstance(raw.get("stores"), list):
                raise ValueError("`stores` is not a list")
            stores = raw["stores"]
        else:  # the old, unkeyed layout
            stores = [{"store": None, "experiment": None, **raw}]
        for entry in stores:
            _check_entry(entry)
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise UserError(
            f"{path}: not a readable tracking state ({e}); move it aside and run "
            f"`platform mlflow-push {path.parent}`: the file only records which rows MLflow "
            "holds, and without it they are looked up in MLflow by their tags"
        ) from None
    return {"version": STATE_VERSION, "stores": stores}


def _check_entry(entry: Any) -> None:
    """Raise ValueError unless `entry` is one store's record; fill its optional fields."""
    if not isinstance(entry, dict):
        raise ValueError(f"a store entry is {type(entry).__name__}, not an object")
    for name in (*_STRING_FIELDS, "note"):  # note: the parent's description's digest, optional
        if not isinstance(entry.get(name), str | None):
            raise ValueError(f"{name} is {entry[name]!r}, not a string")
    figures = entry.get("figures")
    if figures is not None and not (
        isinstance(figures, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in figures.values())
    ):
        raise ValueError(f"`figures` is {figures!r}, not an object of numbers")
    logged = entry.get("logged")
    if not isinstance(logged, dict):
        raise ValueError(f"`logged` is {type(logged).__name__}, not an object")
    for key, row in logged.items():
        if not (
            isinstance(row, dict)
            and isinstance(row.get("run_id"), str)
            and isinstance(row.get("status"), str)
            and isinstance(row.get("config"), str | None)
        ):
            raise ValueError(f"logged row {key!r} is {row!r}, not {{run_id, status}}")
    for name in _STRING_FIELDS:
        entry.setdefault(name, None)


def store_entry(state: dict[str, Any], store: str, experiment: str) -> dict[str, Any]:
    """The entry of `state` for tracking store `store` (its key) and `experiment`; a new, empty
    one is added when there is none."""
    for entry in state["stores"]:
        if entry["store"] == store and entry["experiment"] == experiment:
            return entry
    entry = {
        "store": store,
        "experiment": experiment,
        "experiment_id": None,
        "parent_run_id": None,
        "logged": {},
    }
    state["stores"].append(entry)
    return entry


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace tracking.json at `path` with `state`, whole and owner-only; OSError on failure."""
    write_private(path, json.dumps(state, indent=1))
