"""Mirror the results table to a tracking store (MLflow): a parent run per sweep, a child run
per trial repeat. `Tracker` is the mechanism: what to write and when, on its own writer thread
so the store's latency never holds up the driver; what an outage holds back and when to try
again; how other failures are reported.

MLflow's client calls live in `track/mlflow_store.py` (`MlflowBackend`). What a row becomes in the
store is `track/child_run.py`'s (including its per-step curves, `HISTORY_METRICS`); the parent run's
params and figures (the scaling curves, step = the device count, and the best configuration:
`scaling_metrics`) are `track/parent_run.py`'s; tracking.json, the record of what each store holds,
is `track/state.py`'s; pushing a sweep directory afterwards (`platform mlflow-push`) is
`track/push.py`'s. Every run carries who ran it and from what (`track/run_source.py`: MLflow's user,
source and git commit tags), every child its configuration's label and its sweep; the experiment and
the parent run carry descriptions (`track/notes.py`). Where users look, the link that opens the runs
table, is `track/ui_link.py`'s (`Tracker.link`; `on_open` hears it once the parent run exists).

The driver is the single writer (many processes on one SQLite file contend). Every row is keyed
by `trial_id:repeat` in the store and in tracking.json, so logging is idempotent: a resumed sweep
or `platform mlflow-push` pushes only what the store does not have yet. tracking.json keeps that
record per tracking store (`MlflowBackend.store_key`: for MLflow its URI without credentials)
and experiment, so a sweep directory copied elsewhere (rsynced down from a cluster) is pushed in
full to another store. Each child run is written when the driver hands its row over (as it
arrives; a short window's once the sweep stops measuring: driver/measurement.py,
`MIRROR_AT_ONCE_FROM_S`); the parent's figures when the sweep finishes and on
`platform mlflow-push`.

An unreachable tracking store never stops a sweep: the rows stay in results.parquet and are pushed
later. Any other tracking failure (a bug, a state file that cannot be written) does not stop it
either, and is reported as one message at its end, never taken for an outage.
"""

from __future__ import annotations

import hashlib
import logging
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amdahl.errors import UserError
from amdahl.files import redact_uris
from amdahl.report.build import Report, build_report, report_from_rows
from amdahl.spec.schema import SweepSpec
from amdahl.sweepdir.layout import SweepDir
from amdahl.sweepdir.table import read_results
from amdahl.track.child_run import (
    CONFIG_TAG,
    SWEEP_TAG,
    ChildTarget,
    child_run_key,
    config_label_in,
    config_labels,
    write_child_run,
)
from amdahl.track.mlflow_store import NOTE_TAG, MlflowBackend
from amdahl.track.notes import experiment_note, sweep_note
from amdahl.track.parent_run import scaling_metrics, spec_params
from amdahl.track.records import Metric, now_ms
from amdahl.track.run_source import RunSource, run_source
from amdahl.track.state import load_state, store_entry, write_state
from amdahl.track.ui_link import TrackingLink, tracking_link

log = logging.getLogger(__name__)

#: After a failed write, rows are kept local for this long before the store is tried again.
OFFLINE_RETRY_S = 30.0


class Tracker:
    """One sweep's mirror to the MLflow tracking store (`backend`). No tracking failure escapes
    its methods: an outage is said once (`offline_reason`) and retried later; anything else is
    kept in `error` (or `state_error`) and reported by `finish` or `sync` as one message."""

    def __init__(
        self,
        spec: SweepSpec,
        sweep_dir: Path,
        enabled: bool = True,
        on_open: Callable[[TrackingLink], None] | None = None,
    ):
        """`on_open` is called with `link`, on the tracker's own thread, once `open_soon` has
        the parent run (not when the store is unreachable or has no link to give)."""
        self.spec, self.sweep_dir, self.enabled = spec, Path(sweep_dir), enabled
        self.on_open = on_open
        self._source: RunSource | None = None  # found on first use (a git call)
        self.files = SweepDir(self.sweep_dir)
        self.backend = MlflowBackend(spec.tracking.uri)
        self.state_path = self.files.tracking
        self.state: dict[str, Any] = load_state(self.state_path)
        self._store: dict[str, Any] | None = None  # this store's entry in state["stores"]
        self.offline_reason: str | None = None
        self._offline_until = 0.0
        self.error: str | None = None  # the first tracking failure that is not an outage
        self.state_error: str | None = None  # tracking.json could not be written
        self._pushed = 0  # child runs written, for `sync`'s count
        self._writer: ThreadPoolExecutor | None = None
        if enabled:
            self.backend.begin()  # on the caller's thread, before the writer thread exists

    # ---- public ----------------------------------------------------------------------

    def log_trial(self, row: dict[str, Any]) -> bool:
        """Log one results row as a child run (or update it when a retry changed the row).

        Returns False when tracking is off, the store is unreachable or the row failed to log.
        """
        if not self.enabled:
            return False
        key = child_run_key(row)
        try:
            if self._holds(row):
                return True
            if self._offline_until > time.monotonic():
                return False  # recently unreachable: do not stall the driver on every row
            self._ensure_parent()  # may take over an earlier record of this store
            if self._holds(row):
                return True
            known = self._logged.get(key)
            label = config_label_in(row, self.spec)
            run_id = self._log_child(key, row, known["run_id"] if known else None, label)
        except Exception as e:  # noqa: BLE001 - no tracking failure stops the sweep
            self._failed(e, f"logging row {key}")
            return False
        self._logged[key] = {"run_id": run_id, "status": row["status"], "config": label}
        self._save_state()
        return True

    def open_soon(self) -> None:
        """Connect and create the parent run on the tracker's own thread now, while Ray starts
        the first launch: creating a new SQLite store takes ~3 s of CPU here, which beside the
        first measured trials slowed them (on 2 cores) by up to 25%."""
        if self.enabled:
            self._submit(self._open)

    def log_trial_soon(self, row: dict[str, Any]) -> None:
        """Log a row on the tracker's own thread, so the store's latency never holds up the
        caller (Tune's event loop: a slow callback there lets reported rows pile up, and Ray
        2.60's function trainable can deadlock flushing them). `finish` waits for these
        writes."""
        self._submit(self.log_trial, row)

    def sync(self, rows: list[dict[str, Any]]) -> int:
        """Push every row this store lacks (or holds in an older state), then the scaling
        figures and report files when the parent run lacks these rows' figures; returns how many
        rows were written. A failure that is not an outage is reported (logged) before it
        returns."""
        pushed = self._push(rows)
        if self.enabled and rows and not self.offline_reason:
            self._log_summary(rows, with_files=True)
        self._report_errors(rows)
        return pushed

    def finish(self, outcome: Any, interrupted: bool = False, report: Report | None = None) -> None:
        """Push what an outage held back, then close the parent run with summary, description
        and artifacts. `report`: the sweep directory's report, when the caller has built it."""
        try:
            self._finish(outcome, interrupted, report)
        finally:
            self.close()

    def close(self) -> None:
        """Give the caller's environment back as it was (the backend's settings for the
        tracker's duration); `finish` ends with it."""
        self.backend.end()

    @property
    def link(self) -> TrackingLink | None:
        """The link that opens the sweep's experiment on the runs table (and, for a local
        store, the command that starts the UI), once the experiment is known; else None."""
        if not self.enabled:
            return None
        try:
            return tracking_link(self.backend.store_key, self._entry()["experiment_id"])
        except Exception as e:  # noqa: BLE001 - a link is never worth a failure
            log.debug("no tracking link: %s", e)
            return None

    # ---- the writer thread ---------------------------------------------------------------

    def _submit(self, fn: Any, *args: Any) -> None:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amdahl-tracking")
        self._writer.submit(fn, *args).add_done_callback(self._check_done)

    def _check_done(self, future: Future) -> None:
        """Whatever a write on the writer thread raised is kept, not lost with its future."""
        error = None if future.cancelled() else future.exception()
        if error is not None:
            self._failed(error, "writing on the tracker's thread")

    def _open(self) -> None:
        try:
            self._ensure_parent()
        except Exception as e:  # noqa: BLE001 - rows stay local; `finish` tries again
            self._failed(e, "creating the sweep's parent run")
            return
        link = self.link
        if self.on_open is not None and link is not None:
            self.on_open(link)

    # ---- rows ----------------------------------------------------------------------------

    def _push(self, rows: list[dict[str, Any]]) -> int:
        if not self.enabled:
            return 0
        before = self._pushed
        for row in rows:
            self.log_trial(row)
        return self._pushed - before

    def _holds(self, row: dict[str, Any]) -> bool:
        """Whether this store has the row as it is now, by the tracking state."""
        known = self._logged.get(child_run_key(row))
        return known is not None and known["status"] == row["status"]

    def _log_child(self, key: str, row: dict[str, Any], run_id: str | None, label: str) -> str:
        """Write row `key` into its child run (`run_id`, else found by its key, else new),
        tagged with its configuration's `label`, its sweep and its source."""
        parent = self._ensure_parent()
        experiment_id = self._entry()["experiment_id"]
        tags = {CONFIG_TAG: label, **self._run_tags()}
        target = ChildTarget(
            self.backend, experiment_id, parent, self._logged, self.sweep_dir, tags
        )
        run_id, written = write_child_run(target, key, row, run_id)
        if written:
            self._pushed += 1
        return run_id

    # ---- the parent run ------------------------------------------------------------------

    def _ensure_parent(self) -> str:
        """The sweep's parent run in this store: recorded, taken over from an earlier record,
        or created."""
        self.backend.connect()
        entry = self._entry()
        if entry["parent_run_id"] is None:
            return self._new_parent(entry)
        if entry["experiment_id"] is not None:
            self.backend.reuse_experiment(entry["experiment_id"])
        return entry["parent_run_id"]

    def _run_tags(self) -> dict[str, str]:
        """The tags of every run of this sweep: its directory's name, user and source."""
        if self._source is None:
            self._source = run_source(self.spec)
        return {SWEEP_TAG: self.sweep_dir.name, **self._source.tags()}

    def _new_parent(self, entry: dict[str, Any]) -> str:
        experiment_id, existed = self.backend.experiment(
            self.spec.experiment, experiment_note(self.spec)
        )
        earlier = self._earlier_record(experiment_id) if existed else None
        if earlier is not None:
            entry.update(earlier)
            self._save_state()
            return entry["parent_run_id"]
        run_id = self.backend.create_parent(
            experiment_id, self.sweep_dir.name, self.sweep_dir, self._run_tags()
        )
        entry["parent_run_id"] = run_id
        entry["experiment_id"] = experiment_id
        self._save_state()
        self.backend.log(run_id, params=spec_params(self.spec))
        if self.files.spec.exists():
            self.backend.log_artifact(run_id, self.files.spec)
        return run_id

    def _earlier_record(self, experiment_id: str) -> dict[str, Any] | None:
        """This sweep's parent run in this store when the state does not record it under this
        store's key: recorded before states were keyed by store (an unknown store), or under
        another URI of the same store; else found by the backend (a state file moved aside).
        Run ids are unique across stores, so a recorded parent this store holds means that
        record's rows are this store's too; `write_child_run` looks up the others by their key
        before creating any."""
        for other in self.state["stores"]:
            run_id = other["parent_run_id"]
            if other is self._store or run_id is None:
                continue
            if not self.backend.is_parent(run_id, experiment_id):
                continue
            if other["store"] is None:  # the unknown store is this one
                self.state["stores"] = [e for e in self.state["stores"] if e is not other]
            logged = dict(other["logged"])
            return {"parent_run_id": run_id, "experiment_id": experiment_id, "logged": logged}
        found = self.backend.find_parent(experiment_id, self.sweep_dir)
        if found is None:
            return None
        return {"parent_run_id": found, "experiment_id": experiment_id}

    def _finish(self, outcome: Any, interrupted: bool, report: Report | None) -> None:
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if not self.enabled:
            return
        self._offline_until = 0.0
        self.offline_reason = None
        self._push(outcome.rows)
        if not self.offline_reason:
            self._log_summary(self._all_rows(outcome.rows), report=report)
        if not self.offline_reason:
            self._close_parent(outcome, interrupted)
        self._report_errors(outcome.rows)

    def _close_parent(self, outcome: Any, interrupted: bool) -> None:
        """The sweep's totals and files on its parent run, which ends with the sweep's status."""
        try:
            parent = self._ensure_parent()
            now = now_ms()
            totals = [
                Metric("sweep_wall_s", float(outcome.wall_s), now, 0),
                Metric("trials_failed", float(len(outcome.failed)), now, 0),
            ]
            self.backend.log(parent, totals)
            for path in self.files.mirrored():
                if path.exists():
                    self.backend.log_artifact(parent, path)
            status = "KILLED" if interrupted else "FAILED" if outcome.failed else "FINISHED"
            self.backend.end_run(parent, status)
        except Exception as e:  # noqa: BLE001
            self._failed(e, "closing the sweep's parent run")

    def _all_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The sweep directory's rows (earlier runs' too, when resumed), else `rows`."""
        if not self.files.results.exists():
            return rows
        try:
            return read_results(self.sweep_dir).to_pylist()
        except UserError:  # a damaged table: the report says so; these rows are still known
            return rows

    def _log_summary(
        self, rows: list[dict[str, Any]], with_files: bool = False, report: Report | None = None
    ) -> None:
        """The scaling figures of `rows` and the report's recommendation (the description,
        `track/notes.py`) on the parent run (and, `with_files`, the report files as
        artifacts); each child's configuration label made the report's (`_retag`). Only what
        the parent does not hold yet, by the state, is logged: a resumed sweep adds its new
        points (a point whose value changed, say with more repeats, gets a second value at its
        step: a store cannot delete one), a repeated sync nothing."""
        try:
            metrics, tags = scaling_metrics(rows)
            entry = self._entry()
            held = entry.get("figures") or {}  # absent until first logged
            new = [(k, v, step) for k, v, step in metrics if held.get(f"{k}@{step}") != v]
            note = sweep_note(report if report is not None else self._report(rows))
            digest = hashlib.sha256(note.encode()).hexdigest()[:16]
            if new or digest != entry.get("note"):
                parent = self._ensure_parent()
                now = now_ms()
                figures = [Metric(k, v, now, step) for k, v, step in new]
                self.backend.log(parent, figures, tags={**tags, NOTE_TAG: note})
                if with_files and new:
                    for path in (self.files.results, self.files.report_md, self.files.report_html):
                        if path.exists():
                            self.backend.log_artifact(parent, path)
                entry["figures"] = {**held, **{f"{k}@{step}": v for k, v, step in new}}
                entry["note"] = digest
                self._save_state()
            self._retag(rows)
        except Exception as e:  # noqa: BLE001 - the figures can be logged by a later sync
            self._failed(e, "logging the sweep's scaling figures on its parent run")

    def _report(self, rows: list[dict[str, Any]]) -> Report:
        """The sweep directory's report (its spec's price, its calibration, a search's view),
        else, without a readable results table, the report of `rows`."""
        if self.files.results.exists():
            try:
                return build_report(self.sweep_dir)
            except UserError:
                pass  # a damaged table: these rows are still known
        return report_from_rows(rows, name=self.sweep_dir.name)

    def _retag(self, rows: list[dict[str, Any]]) -> None:
        """Put on each child run the label the report's grouping gives its row over all of
        `rows` (`config_labels`) where it differs from the one the run was tagged with as it
        arrived (`config_label_in`): an `exclude` that leaves an axis one value, rows of an
        earlier spec, a search's rungs (measured under other steps). Usually nothing."""
        for key, label in config_labels(rows).items():
            known = self._logged.get(key)
            if known is None or known.get("config") == label:
                continue
            self.backend.log(known["run_id"], tags={CONFIG_TAG: label})
            known["config"] = label
            self._save_state()

    # ---- the tracking state ---------------------------------------------------------------

    def _entry(self) -> dict[str, Any]:
        """This store's record in the tracking state (created empty when new)."""
        if self._store is None:
            self._store = store_entry(self.state, self.backend.store_key, self.spec.experiment)
        return self._store

    @property
    def _logged(self) -> dict[str, dict[str, str]]:
        return self._entry()["logged"]

    def _save_state(self) -> None:
        """Replace tracking.json. A failure (a full disk) is kept for `_report_errors`, never
        raised into the sweep or lost on the writer thread; a later write that works holds
        everything, and clears it."""
        try:
            write_state(self.state_path, self.state)
        except OSError as e:
            self.state_error = (
                f"could not write {self.state_path} ({type(e).__name__}: {e}), so it does not "
                f"record every row {self.backend.name} now holds"
            )
        else:
            self.state_error = None

    # ---- failures ------------------------------------------------------------------------

    def _failed(self, error: BaseException, doing: str) -> None:
        """An outage waits for the next try; anything else is kept for `_report_errors`."""
        if self.backend.is_outage(error):
            self._offline(error)
            return
        trace = "".join(traceback.format_exception(error))
        log.debug("%s tracking failed %s:\n%s", self.backend.name, doing, redact_uris(trace))
        if self.error is None:
            frames = traceback.extract_tb(error.__traceback__)
            where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
            self.error = redact_uris(f"{doing}: {type(error).__name__}: {error}{where}")

    def _report_errors(self, rows: list[dict[str, Any]]) -> None:
        """Say, as one message, what failed other than an outage: a bug (rows left out of the
        store) or a tracking.json that could not be written."""
        if self.error is None and self.state_error is None:
            return
        name = self.backend.name
        problems = []
        if self.error is not None:
            missing = sum(1 for r in rows if not self._holds(r))
            problems.append(
                f"{name} tracking failed with an error that is not an outage, so {missing} of "
                f"{len(rows)} rows are not in {name}: {self.error}"
            )
        if self.state_error is not None:
            problems.append(self.state_error)
        log.error(
            "%s. Every row is in %s; once the cause is fixed, `platform mlflow-push %s` pushes "
            "what %s lacks (rows it has are found by their tags, not duplicated).",
            "; ".join(problems),
            self.files.results,
            self.sweep_dir,
            name,
        )

    def _offline(self, error: BaseException) -> None:
        self._offline_until = time.monotonic() + OFFLINE_RETRY_S
        if self.offline_reason is None:
            self.offline_reason = redact_uris(f"{type(error).__name__}: {error}")
            log.warning(
                "%s unreachable, results stay in %s until `platform mlflow-push`: %s",
                self.backend.name,
                self.sweep_dir,
                self.offline_reason,
            )
        self.backend.disconnect()
