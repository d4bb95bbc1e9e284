"""The results mirror (`Tracker`) against a second, in-memory tracking store: the interface in
track/backend.py is all the mechanism needs. Outages are retried (the writer thread keeps the
row local and `finish` pushes it), rows a store already holds are never written again (by
tracking.json, and by their key when tracking.json is lost), and a failure that is not an outage
is reported, not taken for one."""

from __future__ import annotations

import itertools
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from report_rows import scaling_rows, write_sweep

from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import TRACKING_FILE
from amdahl.track.backend import ChildRun, Metric, TrackingBackend
from amdahl.track.tracker import Tracker


class Unavailable(Exception):
    """The in-memory store's outage."""


@dataclass
class Run:
    run_id: str
    experiment_id: str
    name: str
    parent_id: str | None = None
    key: str | None = None
    sweep_dir: str | None = None
    status: str = "RUNNING"
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[Metric] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)


@dataclass
class Store:
    """What a store holds, shared by every backend that opens it; `fail` makes its next calls
    raise (an Unavailable, or the error given); `calls` records (operation, thread name)."""

    experiments: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail: list[BaseException] = field(default_factory=list)
    ids: itertools.count = field(default_factory=itertools.count)

    def parents(self) -> list[Run]:
        return [r for r in self.runs.values() if r.parent_id is None]

    def children(self) -> list[Run]:
        return [r for r in self.runs.values() if r.parent_id is not None]

    def writes(self) -> list[str]:
        return [op for op, _ in self.calls if op.startswith(("create", "log", "end_run"))]


class MemoryBackend(TrackingBackend):
    name = "memory"

    def __init__(self, store: Store, key: str = "memory://one"):
        self.store, self.key = store, key
        self.lifecycle: list[tuple[str, str]] = []

    def _call(self, op: str) -> None:
        self.store.calls.append((op, threading.current_thread().name))
        if self.store.fail:
            raise self.store.fail.pop(0)

    def begin(self) -> None:
        self.lifecycle.append(("begin", threading.current_thread().name))

    def end(self) -> None:
        self.lifecycle.append(("end", threading.current_thread().name))

    @property
    def store_key(self) -> str:
        return self.key

    def is_outage(self, error: BaseException) -> bool:
        return isinstance(error, Unavailable)

    def connect(self) -> None:
        self._call("connect")

    def experiment(self, name: str) -> tuple[str, bool]:
        self._call("experiment")
        existed = name in self.store.experiments
        if not existed:
            self.store.experiments[name] = f"e{next(self.store.ids)}"
        return self.store.experiments[name], existed

    def is_parent(self, run_id: str, experiment_id: str) -> bool:
        self._call("is_parent")
        run = self.store.runs.get(run_id)
        return run is not None and run.experiment_id == experiment_id and run.sweep_dir is not None

    def find_parent(self, experiment_id: str, sweep_dir: Path) -> str | None:
        self._call("find_parent")
        path = str(sweep_dir.resolve())
        found = [
            r
            for r in self.store.parents()
            if (r.experiment_id, r.sweep_dir) == (experiment_id, path)
        ]
        return found[0].run_id if found else None

    def create_parent(self, experiment_id: str, name: str, sweep_dir: Path) -> str:
        self._call("create_parent")
        run = Run(
            f"r{next(self.store.ids)}", experiment_id, name, sweep_dir=str(sweep_dir.resolve())
        )
        self.store.runs[run.run_id] = run
        return run.run_id

    def find_child(self, experiment_id: str, parent_id: str, key: str) -> ChildRun | None:
        self._call("find_child")
        for r in self.store.children():
            if (r.experiment_id, r.parent_id, r.key) == (experiment_id, parent_id, key):
                return ChildRun(r.run_id, r.status, dict(r.tags), dict(r.params))
        return None

    def create_child(self, experiment_id: str, parent_id: str, key: str, name: str) -> str:
        self._call("create_child")
        run = Run(f"r{next(self.store.ids)}", experiment_id, name, parent_id=parent_id, key=key)
        self.store.runs[run.run_id] = run
        return run.run_id

    def log(self, run_id, metrics=(), params=None, tags=None) -> None:
        self._call("log")
        run = self.store.runs[run_id]
        for k, v in (params or {}).items():
            if run.params.get(k, v) != v:
                raise ValueError(f"param {k} logged again with a new value")  # as MLflow does
        run.params.update(params or {})
        run.metrics += list(metrics)
        run.tags.update(tags or {})

    def log_artifact(self, run_id: str, path: Path) -> None:
        self._call("log_artifact")
        self.store.runs[run_id].artifacts.append(path.name)

    def end_run(self, run_id: str, status: str) -> None:
        self._call("end_run")
        self.store.runs[run_id].status = status


SPEC = validate_spec({"name": "mem", "workload": "mlp"})


def _tracker(sweep_dir: Path, store: Store, key: str = "memory://one") -> Tracker:
    return Tracker(SPEC, sweep_dir, backend=MemoryBackend(store, key))


def _outcome(rows: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(rows=rows, wall_s=2.0, failed=[])


@pytest.fixture
def sweep(tmp_path) -> tuple[Path, list[dict]]:
    rows = scaling_rows()
    return write_sweep(tmp_path / "mem-1", rows), rows


def test_a_sweep_through_the_interface_records_parent_children_figures_and_files(sweep):
    sweep_dir, rows = sweep
    store = Store()
    tracker = _tracker(sweep_dir, store)
    tracker.open_soon()
    for row in rows:
        tracker.log_trial_soon(row)
    tracker._writer.shutdown(wait=True)
    # the writes ran on the tracker's own thread; settings were made on the caller's
    assert {thread for _, thread in store.calls} == {"amdahl-tracking_0"}
    tracker.finish(_outcome(rows))
    assert tracker.error is None and tracker.offline_reason is None

    (parent,) = store.parents()
    assert parent.status == "FINISHED" and parent.params["name"] == "mem"
    assert "results.parquet" in parent.artifacts
    values = {m.key: m.value for m in parent.metrics}
    assert values["sweep_wall_s"] == 2.0 and values["trials_failed"] == 0.0
    assert any(k.startswith("throughput/") for k in values) and parent.tags["amdahl.best"]
    children = store.children()
    assert sorted(c.key for c in children) == sorted(f"{r['trial_id']}:0" for r in rows)
    for child in children:
        assert child.status == "FINISHED" and child.parent_id == parent.run_id
        assert child.params["sync"] in ("ddp", "none") and child.tags["amdahl.status"] == "ok"
        assert {m.key for m in child.metrics} >= {"throughput"}
    caller = threading.current_thread().name
    assert tracker.backend.lifecycle == [("begin", caller), ("end", caller)]


def test_an_outage_on_the_writer_thread_keeps_rows_local_until_finish(sweep, caplog):
    sweep_dir, rows = sweep
    store = Store(fail=[Unavailable("store is down")])
    tracker = _tracker(sweep_dir, store)
    with caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.log_trial_soon(rows[0])  # the store fails: the tracker goes offline
        tracker.log_trial_soon(rows[1])  # offline: not tried, the driver is not stalled
        tracker._writer.shutdown(wait=True)
    assert tracker.offline_reason == "Unavailable: store is down"
    assert [r.getMessage() for r in caplog.records][0].startswith("memory unreachable")
    assert store.calls == [("connect", "amdahl-tracking_0")] and not store.runs

    tracker.finish(_outcome(rows[:2]))  # tries again: both rows are pushed, once each
    assert tracker.error is None and tracker.offline_reason is None
    assert sorted(c.key for c in store.children()) == sorted(f"{r['trial_id']}:0" for r in rows[:2])
    assert store.parents()[0].status == "FINISHED"
    state = json.loads((sweep_dir / TRACKING_FILE).read_text())
    assert state["stores"][0]["store"] == "memory://one"
    assert len(state["stores"][0]["logged"]) == 2


def test_rows_the_store_holds_are_not_written_again(sweep):
    sweep_dir, rows = sweep
    store = Store()
    assert _tracker(sweep_dir, store).sync(rows) == len(rows)
    held = {r.run_id: (r.status, len(r.metrics)) for r in store.runs.values()}

    store.calls.clear()
    assert _tracker(sweep_dir, store).sync(rows) == 0  # by tracking.json: no call at all
    assert store.calls == []

    (sweep_dir / TRACKING_FILE).unlink()  # lost: the parent and rows are found by their key
    more = [*rows, {**rows[0], "trial_id": "extra"}]
    assert _tracker(sweep_dir, store).sync(more) == 1
    assert store.writes().count("create_child") == 1 and "create_parent" not in store.writes()
    assert len(store.parents()) == 1 and len(store.children()) == len(rows) + 1
    assert all(
        (store.runs[i].status, len(store.runs[i].metrics)) == held[i]
        for i in held
        if store.runs[i].parent_id
    )

    # Another store (a copied directory synced elsewhere) gets everything.
    other = Store()
    assert _tracker(sweep_dir, other, "memory://two").sync(more) == len(more)


def test_a_retried_row_updates_its_run_without_logging_its_params_again(sweep):
    sweep_dir, rows = sweep
    store = Store()
    tracker = _tracker(sweep_dir, store)
    assert tracker.sync([{**rows[0], "status": "failed"}]) == 1
    (child,) = store.children()
    assert child.status == "FAILED"
    assert tracker.sync([{**rows[0], "params": json.dumps({"hidden": [99]})}]) == 1  # now ok
    assert store.children() == [child] and child.status == "FINISHED"
    assert json.loads(child.params["params.hidden"]) == [16]  # set once, as when first logged
    assert tracker.error is None


def test_a_failure_that_is_not_an_outage_is_reported_and_the_next_row_still_logs(sweep, caplog):
    sweep_dir, rows = sweep
    store = Store()
    tracker = _tracker(sweep_dir, store)
    store.fail.append(KeyError("bug"))
    assert not tracker.log_trial(rows[0])
    assert tracker.offline_reason is None and "KeyError: 'bug'" in tracker.error
    assert tracker.log_trial(rows[1])  # not held back as if offline
    with caplog.at_level(logging.WARNING, logger="amdahl.track.tracker"):
        tracker.finish(_outcome(rows[:2]))  # finish pushes the first row too
    (message,) = [r.getMessage() for r in caplog.records if r.name == "amdahl.track.tracker"]
    assert "memory tracking failed with an error that is not an outage" in message
    assert "0 of 2 rows are not in memory" in message
    assert len(store.children()) == 2


def test_each_search_rung_of_a_trial_is_a_child_run_of_its_own(sweep):
    sweep_dir, rows = sweep
    store = Store()
    tracker = _tracker(sweep_dir, store)
    rungs = [{**rows[0], "rung": 0, "steps": 5}, {**rows[0], "rung": 1, "steps": 15}]
    skipped = {**rows[1], "rung": 0, "status": "skipped", "error": "predicted 10 samples/s"}
    assert tracker.sync([*rungs, skipped]) == 3
    by_key = {c.key: c for c in store.children()}
    tid, other = rows[0]["trial_id"], rows[1]["trial_id"]
    assert set(by_key) == {f"{tid}:0:rung0", f"{tid}:0:rung1", f"{other}:0:rung0"}
    assert by_key[f"{tid}:0:rung1"].params["rung"] == "1"
    assert by_key[f"{tid}:0:rung1"].name.endswith("-rung1")
    # a skipped configuration failed nothing: its run is finished, its status tagged
    assert by_key[f"{other}:0:rung0"].status == "FINISHED"
    assert by_key[f"{other}:0:rung0"].tags["amdahl.status"] == "skipped"
    assert tracker.sync([*rungs, skipped]) == 0  # idempotent per rung
