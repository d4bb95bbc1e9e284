"""Resuming a sweep directory: which trial repeats are finished there (`finished_trials`), and
which settings a resume may not change (`spec_changes`: the fingerprint of the measured
settings, recorded in fingerprint.json). `open_sweep_dir` is the driver's way in: the directory
it resumes, or a new one, locked.

A resume that changed a measured setting would put rows measured under different settings side
by side in one results table; it is refused here, before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from amdahl.errors import UserError
from amdahl.files import write_private
from amdahl.spec.load import validate_spec
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.layout import RESULTS_FILE, SPEC_FILE, SweepDir, new_sweep_dir
from amdahl.sweepdir.lock import DirLock, lock_sweep_dir
from amdahl.sweepdir.table import read_results

# --------------------------------------------------------------------------- resuming


def _check_resumable(sweep_dir: Path) -> None:
    d = SweepDir(sweep_dir)
    if not d.results.exists() and not d.spec.exists():
        raise UserError(
            f"{sweep_dir}: nothing to resume (no {RESULTS_FILE} or {SPEC_FILE}); "
            "pass a directory made by `platform sweep`"
        )


def finished_trials(sweep_dir: Path, retry_failed: bool = False) -> set[tuple[str, int]]:
    """(trial_id, repeat) pairs with a final row in a sweep directory (ok ones only, when
    failed ones are to be retried)."""
    _check_resumable(sweep_dir)
    table = read_results(sweep_dir)
    ids, repeats, status = (table[c].to_pylist() for c in ("trial_id", "repeat", "status"))
    return {
        (i, r)
        for i, r, s in zip(ids, repeats, status, strict=True)
        if s == "ok" or not retry_failed
    }


def open_sweep_dir(
    spec: SweepSpec,
    runs_dir: Path,
    resume: str | Path | None,
    retry_failed: bool,
    new_if_changed: bool,
) -> tuple[Path, set[tuple[str, int]], DirLock, bool]:
    """The sweep directory a driver writes, locked (`lock_sweep_dir`); the trial repeats
    already finished there; whether this call made it (a new `runs_dir/<name>-<UTC time>`,
    or, with `resume`, that directory unless its measurement settings differ from `spec`'s:
    then refused, or a new one with `new_if_changed`)."""
    if resume is not None:
        sweep_dir = Path(resume)
        _check_resumable(sweep_dir)  # before locking: no lock file in a foreign directory
        lock = lock_sweep_dir(sweep_dir)
        try:
            changes = spec_changes(sweep_dir, spec)
            if not changes:  # a broken results table fails here
                return sweep_dir, finished_trials(sweep_dir, retry_failed), lock, False
            if not new_if_changed:
                raise UserError(_changed_message(sweep_dir, changes))
        except BaseException:
            lock.release()
            raise
        lock.release()
        logging.getLogger(__name__).warning(
            "%s was measured with other settings (%s): starting a new sweep directory",
            sweep_dir,
            "; ".join(_show_change(c) for c in changes[:3]),
        )
    sweep_dir = new_sweep_dir(runs_dir, spec.name)
    try:
        return sweep_dir, set(), lock_sweep_dir(sweep_dir), True
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- the fingerprint

#: Sweep-file fields that do not change what a trial measures, left out of the fingerprint so
#: a resume may change them: names and bookkeeping (`name`, `tracking`, `report`, `storage`),
#: retries of a crashed launch (`train.max_failures`), the profiler pass after the measured
#: window (`train.profile_steps`), the memory check before a trial runs
#: (`resources.device_memory_gb`, `resources.memory_check`), the number of repeats (`train.repeats`,
#: `search.final_repeats`: a resume with more runs the missing ones) and which trials exist
#: (`grid`, `exclude`: a resume with a larger grid runs the new trials; each row records its
#: own axis values). Everything else (`workload`, `params`, the rest of `train`, `options`,
#: `resources`, `isolation`, the rest of `search`) is in it.
UNMEASURED_FIELDS = (
    "name",
    "tracking",
    "report",
    "storage",
    "grid",
    "exclude",
    "train.repeats",
    "train.max_failures",
    "train.profile_steps",
    "search.final_repeats",
    "resources.device_memory_gb",
    "resources.memory_check",
)


def spec_fingerprint(spec: SweepSpec) -> tuple[str, dict[str, Any]]:
    """A hash of what `spec` sets that changes what is measured (all but UNMEASURED_FIELDS),
    and that content, as written to `fingerprint.json`."""
    measured = _measured(spec.model_dump(mode="json"))
    blob = json.dumps(measured, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16], measured


def write_fingerprint(sweep_dir: Path, spec: SweepSpec) -> None:
    """Record in `sweep_dir` the settings its rows are measured under (written whole, through
    a temporary file of its own)."""
    fingerprint, measured = spec_fingerprint(spec)
    record = {"fingerprint": fingerprint, "measured": measured}
    write_private(SweepDir(sweep_dir).fingerprint, json.dumps(record, indent=1))


def spec_changes(sweep_dir: Path, spec: SweepSpec) -> list[tuple[str, Any, Any]]:
    """(dotted path, old value, new value) for each measured setting that `spec` changes from
    those `sweep_dir`'s rows were measured under; [] when none (or the directory records
    none). The record is `fingerprint.json`, else (a directory written before it existed)
    `spec.yaml`. A field the record lacks counts as changed only when `spec` sets it to other
    than its default (fields added to amdahl later do not block a resume)."""
    recorded = _recorded_measurement(Path(sweep_dir))
    if recorded is None:
        return []
    fingerprint, measured = spec_fingerprint(spec)
    if recorded[0] == fingerprint:
        return []
    default_spec = type(spec).model_validate({"workload": spec.workload})
    defaults = _measured(default_spec.model_dump(mode="json"))
    return [
        (path, old, new)
        for path, old, new in _differences(recorded[1], measured)
        if not _only_a_default(path, old, new, defaults) and not _auto_resolves(path, new)
    ]


def _auto_resolves(path: str, new: Any) -> bool:
    """`resources: auto` (null) against a recorded number is no change of the spec: the planner
    picks the number, and the trial ids (which hash the resources used) keep rows measured
    under other numbers apart from the new ones."""
    return path in ("resources.cpus_per_device", "resources.cpus_per_data_worker") and new is None


_ABSENT = object()


def _measured(dumped: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(dumped, default=str))
    for dotted in UNMEASURED_FIELDS:
        *parents, leaf = dotted.split(".")
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def _recorded_measurement(sweep_dir: Path) -> tuple[str | None, dict[str, Any]] | None:
    problems = []
    fingerprint_path, spec_path = SweepDir(sweep_dir).fingerprint, SweepDir(sweep_dir).spec
    if fingerprint_path.exists():
        try:
            record = json.loads(fingerprint_path.read_text())
            fingerprint, measured = record.get("fingerprint"), record.get("measured")
            if isinstance(fingerprint, str) and isinstance(measured, dict):
                return fingerprint, measured
            problems.append(f"{fingerprint_path}: not a fingerprint record")
        except (OSError, ValueError, AttributeError) as e:
            problems.append(f"{fingerprint_path}: unreadable ({_one_line(e)})")
    if spec_path.exists():
        try:
            raw = yaml.safe_load(spec_path.read_text())
        except (OSError, yaml.YAMLError) as e:
            problems.append(f"{spec_path}: unreadable ({_one_line(e)})")
        else:
            if isinstance(raw, dict):
                try:
                    raw = validate_spec(raw, source=str(spec_path)).model_dump(mode="json")
                except UserError:
                    pass  # written by another amdahl version: compare what it says
                return None, _measured(raw)
            problems.append(f"{spec_path}: not a sweep file")
    if problems:
        raise UserError(
            f"--resume {sweep_dir}: cannot tell which settings its rows were measured under "
            f"({'; '.join(problems)}); restore the file, or add --new-if-changed to start a "
            "new sweep directory"
        )
    return None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _differences(old: Any, new: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys(), key=str):
            sub = f"{path}.{key}" if path else str(key)
            yield from _differences(old.get(key, _ABSENT), new.get(key, _ABSENT), sub)
    elif old != new:
        yield path, old, new


def _only_a_default(path: str, old: Any, new: Any, defaults: dict[str, Any]) -> bool:
    if old is not _ABSENT and new is not _ABSENT:
        return False
    node: Any = defaults
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return (new if old is _ABSENT else old) == node


def _show_change(change: tuple[str, Any, Any]) -> str:
    path, old, new = change
    show = lambda v: "(unset)" if v is _ABSENT else json.dumps(v)  # noqa: E731
    return f"{path}: {show(old)} -> {show(new)}"


def _changed_message(sweep_dir: Path, changes: list[tuple[str, Any, Any]]) -> str:
    lines = [
        f"--resume {sweep_dir}: these settings differ from the ones its rows were measured "
        "under (old -> new):"
    ]
    lines += [f"  {_show_change(c)}" for c in changes[:12]]
    if len(changes) > 12:
        lines.append(f"  ... and {len(changes) - 12} more")
    lines.append(
        "resuming would put rows measured under different settings side by side. Resume "
        f"with the settings in {SweepDir(sweep_dir).spec}, or add --new-if-changed to start a "
        "new sweep directory with these (as running without --resume does)"
    )
    return "\n".join(lines)
