"""The sweep's worker groups, kept warm: one launch per worker-group shape, fed by the driver.

Ray Train takes tens of seconds to start a worker group (a Tune trainable, a Train controller,
its workers: each a new process importing Ray and torch). `LaunchPool` pays that once per shape
per sweep where it can: it starts one Tune trial per shape (each fits one TorchTrainer running
worker/harness.py), and hands those launches work through the sweep's `WorkQueue` actor for as
long as the driver has work of their shape: every trial, repeat, search rung and relaunch.
`measure(items)` puts items in the queue and returns once each has a row or a failure;
between two calls the launches wait, idle, for the driver's next decision (the next rung).

Ray stays the engine: Tune schedules the launches (in a thread of the driver, while the
driver's main thread feeds the queue and records rows), each launch is one Train run, and a
launch that cannot start because others hold the resources (`isolation: exclusive` runs one
at a time) gets them when an idle launch is closed for it. A launch that dies past
`train.max_failures` loses the item it was running (recorded as failed, with the error); the
rest of its items go to a new launch, unless that one too dies before finishing anything.
No Train checkpoint is written: the queue and results.parquet are the record
(docs/architecture.md, "Launches").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import ray
from ray import tune

from amdahl.driver.events import LaunchStarted
from amdahl.driver.launch_watch import LaunchWatch
from amdahl.driver.trainable import launch_config, launch_trainable, materialise_datasets
from amdahl.driver.work_queue import WorkQueue
from amdahl.plan.launches import Launch
from amdahl.plan.resources import DRIVER_CPUS
from amdahl.protocol.contract import LaunchConfig
from amdahl.protocol.identity import failure_status, row_identity
from amdahl.protocol.items import WorkItem
from amdahl.protocol.queue import Answered, Entered, QueueEvent
from amdahl.sweepdir.driver_files import ray_storage

if TYPE_CHECKING:
    from pathlib import Path

    from amdahl.driver.events import EventHandler
    from amdahl.driver.signals import InterruptFlag
    from amdahl.plan.launches import SweepPlan
    from amdahl.spec.schema import SweepSpec

#: How long the driver waits for the queue's next event before it looks at its launches
#: (seconds): a row, a failure or a group's entry ends the wait at once (a long poll, so a
#: rung's end is seen at once); seldom enough otherwise that the driver and the queue's actor
#: take no measurable CPU from the workers (on a 2-core machine they share the cores).
_TICK_S = 0.2


class LaunchPool:
    """The launches of one sweep (one per worker-group shape) and the queue that feeds them."""

    def __init__(
        self,
        spec: SweepSpec,
        plan: SweepPlan,
        sweep_dir: Path,
        record: Callable[[dict[str, Any]], None],
        emit: EventHandler,
        interrupt: InterruptFlag,
        grouping: tuple[bool, bool] = (True, True),
    ):
        """`record` takes each final row (the driver's single writer), `emit` progress
        events; `grouping`: SweepPlan.launches' `group` and `across_devices`."""
        group, across_devices = grouping
        self.spec, self.sweep_dir = spec, sweep_dir
        self.record, self.emit, self.interrupt = record, emit, interrupt
        launches = plan.launches(set(), group, across_devices)
        self.shapes: dict[str, Launch] = {launch.launch_id: launch for launch in launches}
        self.queue = work_queue_actor(len(self.shapes))
        self.watch = LaunchWatch()
        self.configs: dict[str, LaunchConfig] = {}
        self.datasets: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._round = 0
        self._tune_error: str | None = None
        self._starts: dict[str, int] = {}  # worker-group starts per launch
        self._running: set[str] = set()  # launches Tune has started and not yet ended
        self._unanswered: dict[str, WorkItem] = {}
        self._rows_this_start: dict[str, int] = {}
        self._deaths: dict[str, int] = {}  # launches that died in a row without a row
        self._closed_idle: set[str] = set()  # launches closed, idle, to free their resources
        self._why: dict[str, str] = {}  # why each launch's next group starts (`_start_round`)
        #: One (launch id, why) per worker group started, in order: the closing summary's.
        self.start_reasons: list[tuple[str, str]] = []
        #: Unix time the first measured window of the sweep opened (its first ok row's).
        self.first_window_unix: float | None = None
        #: Measurements of `calibrate` items, in order ({"error": ...} for one that failed).
        self.calibrations: list[dict[str, Any]] = []

    # ----------------------------------------------------------------------- the driver's API

    def measure(self, items: list[WorkItem]) -> None:
        """Put `items` in the queue and return once every one has a row or a failure (or the
        sweep was interrupted)."""
        if not items:
            return
        self._unanswered.update({item.key: item for item in items})
        ray.get(self.queue.put.remote(items))
        while self._unanswered and not self.interrupt.is_set():
            self._tick()
        if self.interrupt.is_set():  # Ctrl-C, SIGTERM: nothing new starts
            ray.get(self.queue.cancel.remote(list(self.shapes)))
        self._take()

    def calibrate(self, devices: int, max_bytes: int) -> dict[str, Any] | None:
        """Measure the all-reduce on the live launch with the most workers (at least
        `devices`), as `platform calibrate` would on a group of its own, and return the
        measurement (worker.calibration_measurement.calibration_result); None where no launch
        has that many workers, or the measurement failed."""
        widest = self.calibration_launch(devices)
        if widest is None:
            return None
        done = len(self.calibrations)
        key = f"calibrate/{done}"
        item = WorkItem(key, widest.launch_id, "", 0, kind="calibrate", max_bytes=max_bytes)
        self.measure([item])
        result = self.calibrations[done] if len(self.calibrations) > done else None
        return None if result is None or "error" in result else result

    def calibration_launch(self, devices: int) -> Launch | None:
        """The launch `calibrate` measures on (`calibration_launch`), None where none has
        `devices` workers."""
        return calibration_launch(list(self.shapes.values()), self._running, devices)

    def close(self) -> None:
        """No more work: every launch returns once its queue is empty; wait for Tune, take
        what is left, end the queue."""
        ray.get(self.queue.close.remote(list(self.shapes)))
        if self._thread is not None:
            while self._thread.is_alive():
                self._thread.join(timeout=_TICK_S)
                self._take()
        self._take()
        ray.kill(self.queue)

    def group_starts(self) -> int:
        """Worker groups started (restarts after a worker died included)."""
        return sum(self._starts.values())

    def _start_reason(self, lid: str) -> str:
        """Why `lid`'s next worker group starts (`start_reason`)."""
        return start_reason(
            lid in self._starts,
            bool(self._deaths.get(lid)),
            lid in self._closed_idle,
            {item.kind for item in self._unanswered.values() if item.launch_id == lid},
        )

    # ----------------------------------------------------------------------- one tick

    def _tick(self) -> None:
        events, load = ray.get(self.queue.poll.remote(_TICK_S))  # one round trip a tick
        self._record(events)
        for kind, lid, detail in self.watch.drain():
            if kind == "started":
                self._running.add(lid)
                self.emit(LaunchStarted(self.shapes[lid]))
            else:
                self._running.discard(lid)
                if kind == "failed":
                    self._launch_died(lid, detail)
                    return  # what it leaves shows in the next tick's load
        self._schedule(load)

    def _take(self) -> None:
        self._record(ray.get(self.queue.drain_events.remote()))

    def _record(self, events: list[QueueEvent]) -> None:
        """The queue's events, in order: rows and failures recorded, calibrations kept."""
        for event in events:
            if isinstance(event, Entered):
                launch_id = event.launch_id
                # a second entry in one round: Ray Train restarted the group (max_failures)
                why = self._why.pop(launch_id, "again: Ray Train restarted it after a failure")
                self.start_reasons.append((launch_id, why))
                self._rows_this_start[launch_id], self._starts[launch_id] = 0, event.start
                continue
            item = event.item
            self._unanswered.pop(item.key, None)
            self._rows_this_start[item.launch_id] = self._rows_this_start.get(item.launch_id, 0) + 1
            self._deaths[item.launch_id] = 0
            answered = isinstance(event, Answered)
            if item.kind == "calibrate":
                self.calibrations.append(event.row if answered else {"error": event.reason})
            elif answered:
                self._note_first_window(event.row)
                self.record(event.row)
            else:
                self.record(self._failed_row(item, event.reason))

    def _note_first_window(self, row: dict[str, Any]) -> None:
        """When the sweep's first measured window opened: the earliest a worker stamped on an
        ok row (`window_opened_unix`; rows arrive in the order trials end, not start)."""
        opened = row.get("window_opened_unix")
        if row.get("status") == "ok" and opened is not None:
            first = self.first_window_unix
            self.first_window_unix = opened if first is None else min(first, opened)

    def _failed_row(self, item: WorkItem, reason: str) -> dict[str, Any]:
        config = self.configs[item.launch_id].for_item(item)
        trial = next(t for t in config.trials if t.trial_id == item.trial_id)
        identity = row_identity(config, trial, item.repeat)
        return {**identity, "status": failure_status(reason), "error": reason, "wall_s": 0.0}

    def _launch_died(self, lid: str, error: str) -> None:
        """A launch failed past train.max_failures: the item it was running fails with the
        error; its other items wait for a new launch, unless this one had itself finished
        nothing since it started (then no item escapes the cause: all of them fail)."""
        self._deaths[lid] = self._deaths.get(lid, 0) + 1
        hopeless = self._deaths[lid] > 1 and not self._rows_this_start.get(lid)
        ray.get(self.queue.abandon.remote(lid, error, hopeless))
        self._take()

    def _schedule(self, load: dict[str, tuple[int, int]]) -> None:
        """Start launches for the shapes that have work and none running; close an idle
        launch whose resources another shape with work is waiting for."""
        waiting = {lid for lid, (pending, _) in load.items() if pending}
        if self._thread is None or not self._thread.is_alive():
            if self._tune_error:  # Tune itself failed: no new round would fare better
                for lid in waiting:
                    ray.get(self.queue.abandon.remote(lid, self._tune_error, True))
                self._take()
            elif waiting:
                self._start_round(sorted(waiting, key=list(self.shapes).index))
            return
        if waiting - self._running:
            idle = [lid for lid in self._running if load.get(lid, (0, 0)) == (0, 0)]
            if idle:
                self._closed_idle.update(idle)
                ray.get(self.queue.close.remote(idle))

    def _start_round(self, launch_ids: list[str]) -> None:
        """One Tuner over these launches, fitted in a thread of the driver."""
        spec = self.spec
        self._round += 1
        session = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        for lid in launch_ids:
            self._why[lid] = self._start_reason(lid)
            self._closed_idle.discard(lid)
            self.configs[lid] = launch_config(
                spec, self.shapes[lid], self.sweep_dir, f"{session}-{self._round}", self.queue
            )
        configs = {lid: self.configs[lid] for lid in launch_ids}
        self.datasets.update(materialise_datasets(spec, list(configs.values()), self.datasets))
        ray.get(self.queue.reopen.remote(launch_ids))
        tuner = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(launch_trainable, configs=configs, datasets=self.datasets),
                {"CPU": DRIVER_CPUS},
            ),
            # Tune's variant generator takes dataclass values apart: it grids over launch ids,
            # and each trainable looks its LaunchConfig up.
            param_space={"launch_id": tune.grid_search(launch_ids)},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=1 if spec.isolation == "exclusive" else len(launch_ids),
                trial_name_creator=_launch_name,
                trial_dirname_creator=_launch_name,
            ),
            run_config=tune.RunConfig(
                name=f"tune-{self._round}",
                storage_path=ray_storage(spec, self.sweep_dir),
                callbacks=[self.watch, *_quiet_progress()],
                stop=self.interrupt,
                verbose=0,
            ),
        )
        self._thread = threading.Thread(
            target=self._fit, args=(tuner,), name="amdahl-tune", daemon=True
        )
        self._thread.start()

    def _fit(self, tuner: tune.Tuner) -> None:
        """The Tune thread: a launch's failure is a trial error (LaunchWatch); Tune's own is
        kept, and fails the items it leaves."""
        try:
            tuner.fit()
        except Exception as e:  # noqa: BLE001 - reported as the items' reason
            self._tune_error = f"launch failed: Ray Tune stopped: {type(e).__name__}: {e}"


def work_queue_actor(launches: int) -> Any:
    """The sweep's WorkQueue actor: on the driver's node, holding no CPU (it only passes small
    messages), and threaded, so that a lease or poll waiting for its next event (each launch's
    rank 0, a rank 0 that died waiting, the driver) holds a thread, never the others' calls."""
    here = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(WorkQueue)
        .options(
            num_cpus=0,
            max_concurrency=2 * launches + 4,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                here, soft=False
            ),
        )
        .remote()
    )


def start_reason(started: bool, died: bool, closed_idle: bool, pending: set[str]) -> str:
    """Why a launch's worker group starts: its shape's first start, or what brought it back
    (`pending`: the kinds of its items waiting; a start only for a calibration is the one a
    live group could have spared)."""
    if not started:
        return "first start of a shape"
    if died:
        return "again: its last group died"
    work = "the calibration" if pending == {"calibrate"} else "more work"
    if closed_idle:
        return f"again for {work}: closed while idle, to free resources for another shape"
    return f"again for {work}: its group had ended"


def calibration_launch(shapes: list[Launch], running: set[str], devices: int) -> Launch | None:
    """The launch to measure the all-reduce on: the widest shape (the calibration measures
    every device count up to its width), one whose group is still up where one is (starting a
    group for a few seconds of measurement costs tens of seconds); None where no shape has
    `devices` workers."""
    width = max(launch.resources.workers for launch in shapes)
    if width < devices:
        return None
    wide = [launch for launch in shapes if launch.resources.workers == width]
    return next((w for w in wide if w.launch_id in running), wide[0])


def _launch_name(trial: Any) -> str:
    return f"launch-{trial.config['launch_id']}"


def _quiet_progress() -> list[Any]:
    """Tune's older output flow (connect_ray selects it unless `--verbose`, through
    RAY_AIR_NEW_OUTPUT=0) prints "Trial launch-... completed. Last result:" for every launch
    whatever RunConfig's `verbose` says, unless a TrialProgressCallback is already given: this
    one prints nothing (the driver's own progress lines say what happened)."""
    import os

    if os.environ.get("RAY_AIR_NEW_OUTPUT", "1") != "0":
        return []  # the newer flow follows `verbose`, and would ignore this callback with a warning
    from ray.tune.progress_reporter import TrialProgressCallback

    class QuietProgress(TrialProgressCallback):
        def _print(self, msg: str) -> None:
            pass

    return [QuietProgress()]
