"""One sweep's directory (`runs/<name>-<UTC stamp>/`): the name of every file in it, and every
read and write of the directory as a whole, in one place.

- the layout: the file names below and `SweepDir`, their paths in one directory;
- a new directory (`open_sweep_dir` -> `_new_sweep_dir`), or the newest of a sweep
  (`latest_sweep_dir`, for `--resume` without a directory);
- what the driver writes before the first trial (`write_sweep_files`: spec.yaml, plan.json as
  `plan_summary` gives it, fingerprint.json);
- what a resume reads (`finished_trials`) and what it may not change (`spec_changes`: the
  fingerprint of the measured settings);
- one writer at a time (`lock_sweep_dir`: driver.lock, held by a driver or a push to MLflow);
- where Ray keeps the sweep's state (`ray_storage`).

Pure (no Ray, no torch): the driver, the report, the MLflow mirror and calibrate all find a
sweep's files through this module, so the layout is defined once (docs/architecture.md,
"A sweep directory"). It imports no other amdahl module at module level but errors and files,
so any module (results.py, spec.py) can import its names without an import cycle.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from amdahl.errors import UserError
from amdahl.files import private_dir, write_private

if TYPE_CHECKING:
    from amdahl.plan.trials import SweepPlan, Trial
    from amdahl.spec.schema import SweepSpec

SPEC_FILE = "spec.yaml"
PLAN_FILE = "plan.json"
RESULTS_FILE = "results.parquet"
REPORT_MD_FILE = "report.md"
REPORT_HTML_FILE = "report.html"
CALIBRATION_FILE = "calibration.json"
TRACKING_FILE = "tracking.json"
#: Held (flock) by the process writing a sweep directory (its driver, or a push to MLflow) for
#: as long as it writes; it names that process (pid, host, start) for the next one that tries.
LOCK_FILE = "driver.lock"
#: The settings a sweep directory's rows were measured under, and their hash.
FINGERPRINT_FILE = "fingerprint.json"
RAY_LOG_FILE = "ray.log"
#: Ray Tune's and Train's state on the driver's disk, when the spec names no shared `storage`.
RAY_DIR = "ray"


@dataclass(frozen=True)
class SweepDir:
    """Paths of one sweep directory's files."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def spec(self) -> Path:
        return self.path / SPEC_FILE

    @property
    def plan(self) -> Path:
        return self.path / PLAN_FILE

    @property
    def results(self) -> Path:
        return self.path / RESULTS_FILE

    @property
    def report_md(self) -> Path:
        return self.path / REPORT_MD_FILE

    @property
    def report_html(self) -> Path:
        return self.path / REPORT_HTML_FILE

    @property
    def calibration(self) -> Path:
        return self.path / CALIBRATION_FILE

    @property
    def tracking(self) -> Path:
        return self.path / TRACKING_FILE

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def fingerprint(self) -> Path:
        return self.path / FINGERPRINT_FILE

    @property
    def ray_log(self) -> Path:
        return self.path / RAY_LOG_FILE

    @property
    def ray_dir(self) -> Path:
        return self.path / RAY_DIR

    def mirrored(self) -> tuple[Path, ...]:
        """The files the MLflow mirror uploads as the parent run's artifacts."""
        return (self.spec, self.plan, self.results, self.report_md, self.report_html)


def existing_sweep_dir(sweep_dir: str | Path) -> SweepDir:
    """A directory `platform sweep` wrote (it holds spec.yaml), else one UserError."""
    d = SweepDir(sweep_dir)
    if not d.spec.is_file():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (no {SPEC_FILE} in it); pass a directory "
            "made by `platform sweep`"
        )
    return d


def ray_storage(spec: SweepSpec, sweep_dir: Path, *sub: str) -> str:
    """Where Ray Tune and Train keep this sweep's state: `<storage>/<sweep dir name>/...` when
    the spec names shared storage (one folder per sweep, so sweeps never collide), else
    `<sweep dir>/ray/...` on the driver's disk (single-node plans only, see check_storage)."""
    if spec.storage is None:
        return str(Path(SweepDir(sweep_dir).ray_dir, *sub).resolve())
    return "/".join([spec.storage.rstrip("/"), Path(sweep_dir).name, *sub])


# --------------------------------------------------------------------------- naming

#: The UTC time in a sweep directory's name, `<name>-<stamp>` (then `-2`, `-3`... when several
#: sweeps of one name start in the same second).
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_STAMP = r"\d{8}T\d{6}Z(?:-\d+)?"


def _new_sweep_dir(runs_dir: Path, name: str) -> Path:
    """A new `<name>-<UTC time>` directory that this call alone made: mkdir refuses one that
    exists (another driver's, started in the same second), and the next suffix is tried."""
    stamp = datetime.now(timezone.utc).strftime(STAMP_FORMAT)
    runs_dir.mkdir(parents=True, exist_ok=True)
    for suffix in itertools.count(1):
        path = runs_dir / (f"{name}-{stamp}" if suffix == 1 else f"{name}-{stamp}-{suffix}")
        try:
            private_dir(path)  # owner-only: the files inside can hold configuration
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def latest_sweep_dir(runs_dir: str | Path, name: str) -> Path:
    """The newest `runs/<name>-<UTC time>` directory, for `--resume` without a directory: the
    name must match exactly, so sweep `scaling` never picks `scaling-big-<UTC time>`. Newest
    is the last written to; a directory whose driver still runs is picked, then refused by
    its lock (see `lock_sweep_dir`)."""
    own = re.compile(re.escape(name) + "-" + _STAMP)
    candidates = sorted(
        (p for p in Path(runs_dir).glob(f"{name}-*") if own.fullmatch(p.name) and p.is_dir()),
        key=lambda p: p.stat().st_mtime,
    )
    if not candidates:
        raise UserError(
            f"--resume: no earlier sweep named {name!r} under {runs_dir}/ (a directory named "
            f"{name}-<UTC time>, e.g. {name}-20250101T120000Z); "
            "pass the sweep directory explicitly"
        )
    return candidates[-1]


# --------------------------------------------------------------------------- the driver's files


def write_sweep_files(sweep_dir: Path, spec: SweepSpec, plan: SweepPlan) -> None:
    """spec.yaml (the spec as given: a resume compares with it), plan.json, fingerprint.json."""
    d = SweepDir(sweep_dir)
    write_private(d.spec, yaml.safe_dump(spec.model_dump(), sort_keys=False))
    write_private(d.plan, json.dumps(plan_summary(plan), indent=1))
    write_fingerprint(d.path, spec)


def plan_summary(plan: SweepPlan) -> dict[str, Any]:
    """The plan as plain data (written to plan.json, shown by `platform plan --json`)."""

    def trial(t: Trial) -> dict[str, Any]:
        return {
            "trial_id": t.trial_id,
            "label": t.label(),
            "settings": t.settings,
            "resources": t.resources.describe(),
            "refused": t.refused,
        }

    return {
        "nodes": [vars(n) for n in plan.nodes],
        "resources": plan.spec.resources.model_dump(),
        "resource_note": plan.resource_note,
        "trials": [trial(t) for t in plan.trials],
        "launches": [
            {"launch_id": launch.launch_id, "trials": [t.trial_id for t in launch.trials]}
            for launch in plan.launches()
        ],
    }


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
    from amdahl.sweepdir.table import read_results  # here: results.py may name its file from here

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
    """The sweep directory a driver writes, locked (see `lock_sweep_dir`); the trial repeats
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
    sweep_dir = _new_sweep_dir(runs_dir, spec.name)
    try:
        return sweep_dir, set(), lock_sweep_dir(sweep_dir), True
    except BaseException:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- the lock

#: `lock_sweep_dir`'s `by` for a sweep's driver.
DRIVER = "sweep driver"
#: What a second driver is told when a driver holds the directory.
_DRIVER_ADVICE = (
    "two drivers in one directory would run the same trials twice, spoil each other's timings "
    "and overwrite each other's files. Wait for it to end, or stop it (Ctrl-C in its terminal, "
    "or `kill -INT <pid>` on its host) and resume then; or drop --resume to start a new sweep "
    "directory"
)


class DirLock:
    """A sweep directory held by this process (see `lock_sweep_dir`) until `release` (or the
    end of a `with` block)."""

    def __init__(self, path: Path, file: Any):
        self.path, self._file = path, file

    def release(self) -> None:
        self._file.close()  # closing the file drops the lock

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_sweep_dir(sweep_dir: Path, by: str = DRIVER, advice: str = _DRIVER_ADVICE) -> DirLock:
    """Hold `sweep_dir` for this process: an exclusive flock on `driver.lock` inside it.

    Anyone else who tries (a `--resume` of a sweep that still runs, in another terminal or on
    another host of a shared filesystem; a push to MLflow) is refused with exit 2, naming the
    holder (`by`: what it is), its pid and host, and `advice` (what a second writer would spoil,
    and what to do). The kernel drops the lock when its process ends, however it ends (SIGKILL,
    OOM kill), so a killed driver's directory resumes at once; the file stays and names the
    last holder.
    """
    path = SweepDir(sweep_dir).lock
    try:
        file = open(path, "a+")  # noqa: SIM115 - stays open as long as the lock is held
    except OSError as e:
        raise UserError(
            f"{sweep_dir}: cannot create {LOCK_FILE} there ({e.strerror or e}); a sweep "
            "directory must be writable by the driver"
        ) from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder, held_by = _lock_holder(file)
        file.close()
        message = f"{sweep_dir} is in use by another {held_by} ({holder}); {advice}"
        raise UserError(message) from None
    except OSError as e:
        file.close()
        raise UserError(
            f"{sweep_dir}: cannot lock {LOCK_FILE} ({e.strerror or e}); keep sweep "
            "directories on a filesystem with file locks (a local disk, or NFS with locking)"
        ) from None
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    file.seek(0)
    file.truncate()
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "by": by}
    file.write(json.dumps(record))
    file.flush()
    return DirLock(path, file)


def _lock_holder(file: Any) -> tuple[str, str]:
    """Who holds the lock and what it is, as its lock file says (the holder writes it just
    after locking; a file written before `by` was recorded names a driver)."""
    for _ in range(20):
        file.seek(0)
        try:
            holder = json.loads(file.read() or "null")
        except ValueError:
            holder = None
        if isinstance(holder, dict) and "pid" in holder:
            who = (
                f"pid {holder['pid']} on host {holder.get('host', '?')}, "
                f"running since {holder.get('since', '?')}"
            )
            return who, str(holder.get("by") or DRIVER)
        time.sleep(0.05)
    return f"pid and host not recorded in {file.name}", DRIVER


# --------------------------------------------------------------------------- the fingerprint

#: Sweep-file fields that do not change what a trial measures, left out of the fingerprint so
#: a resume may change them: names and bookkeeping (`name`, `tracking`, `report`, `storage`),
#: retries of a crashed launch (`train.max_failures`), the number of repeats (`train.repeats`,
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
    "search.final_repeats",
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
        from amdahl.spec.schema import validate_spec

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
