"""The driver's work queue: trial runs handed to long-lived worker groups, with lease and ack.

One `WorkQueue` Ray actor per sweep, created by the driver on its own node
(driver/pool.py). The driver puts `WorkItem`s (one trial repeat, of a search rung or of a grid)
for the launch whose worker-group shape serves them; rank 0 of that launch leases the next one,
broadcasts it to its group, and acknowledges it with the results row once every rank has run it.
So a worker group lives for as long as the driver has work of its shape, across trials,
repeats, rungs and relaunches, and pays Ray's start once (docs/architecture.md, "Launches").

The queue, not a Train checkpoint, is the record of what is done: an item leased by a worker
group that then dies is handed again to the restarted group (`enter`), and one that was leased
twice without an answer is given up with the reason. Rows and give-ups wait in the queue, as
the events of protocol.queue (Entered, Answered, GivenUp), until the driver drains them
(`drain_events`): the driver alone writes results.parquet and MLflow.

Why it lives in driver/: it is the driver's bookkeeping (what is pending, leased, done, given
up), which the driver creates, feeds and reads. The workers never import this class: they hold
a handle to the actor (`LaunchConfig.queue`) and call the five methods of
protocol.queue.WorkerQueue (`enter`, `lease`, `ack`, `attach`, `fail`) through
worker.queue_client.QueueClient, with the plain data of amdahl.protocol.items (WorkItem, its
key, WAIT, CLOSED). Plain Python (no Ray import): the driver wraps it with `ray.remote` as a
threaded actor, so that a waiting `lease` or `poll` (a long poll: it returns the moment there is
something) does not hold up the other calls. Every method holds one lock (a Condition that
the waiting calls sleep on), so the state is never seen half-changed.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from amdahl.protocol.items import CLOSED, TRACES, WAIT, WorkItem
from amdahl.protocol.queue import Answered, Entered, GivenUp, QueueEvent

#: How many times an item is handed out before a worker group's death during it gives it up.
MAX_DELIVERIES = 2

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _changes(method: _Method) -> _Method:
    """A call that may change what a waiting `lease` or `poll` waits for: run under the lock,
    then wake the waiters (they look again, and sleep on where nothing is theirs)."""

    @functools.wraps(method)
    def locked(self: WorkQueue, *args: Any, **kwargs: Any) -> Any:
        with self._changed:
            result = method(self, *args, **kwargs)
            self._changed.notify_all()
            return result

    return locked  # type: ignore[return-value]


def _reads(method: _Method) -> _Method:
    """A call that only reads: under the lock, so it never sees a change half done."""

    @functools.wraps(method)
    def locked(self: WorkQueue, *args: Any, **kwargs: Any) -> Any:
        with self._changed:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class WorkQueue:
    """Per launch: items waiting, items leased (with how often each was handed out), whether
    the driver has closed it; and the events the driver has not taken yet."""

    def __init__(self) -> None:
        self._pending: dict[str, deque[WorkItem]] = {}
        self._leased: dict[str, WorkItem] = {}
        self._deliveries: dict[str, int] = {}
        self._closed: set[str] = set()
        self._starts: dict[str, int] = {}
        self._events: list[QueueEvent] = []
        self._traces: dict[str, dict[int, bytes]] = {}  # per leased item, by rank
        self._changed = threading.Condition()  # the lock; notified by every change

    # ----------------------------------------------------------------------- the driver

    @_changes
    def put(self, items: list[WorkItem]) -> None:
        for item in items:
            self._pending.setdefault(item.launch_id, deque()).append(item)

    @_changes
    def close(self, launch_ids: list[str]) -> None:
        """No further item for these launches: their workers return once the queue is empty."""
        self._closed.update(launch_ids)

    @_changes
    def cancel(self, launch_ids: list[str]) -> int:
        """Stop now (Ctrl-C): the launches' waiting items are dropped, unrecorded (a resume
        runs them), and their queues closed; an item already leased still answers. Returns
        how many were dropped."""
        dropped = sum(len(self._pending.pop(lid, ())) for lid in launch_ids)
        self._closed.update(launch_ids)
        return dropped

    @_changes
    def reopen(self, launch_ids: list[str]) -> None:
        """A new worker group for these launches is about to start."""
        self._closed.difference_update(launch_ids)

    @_changes
    def drain_events(self) -> list[QueueEvent]:
        """The events since the last drain, in order, taken out of the queue (a group's
        entry, an item's answer, an item given up)."""
        events, self._events = self._events, []
        return events

    def poll(self, wait_s: float = 0.0) -> tuple[list[QueueEvent], dict[str, tuple[int, int]]]:
        """`drain_events` and `load` in one call: what the driver reads each tick. Where there
        is no event yet, it waits for one up to `wait_s` seconds (the driver's tick: a row, a
        failure or a group's entry wakes it at once)."""
        with self._changed:
            self._changed.wait_for(lambda: self._events, timeout=wait_s)
            return self.drain_events(), self.load()

    @_reads
    def load(self) -> dict[str, tuple[int, int]]:
        """Per launch with any item: (pending, leased)."""
        out = {lid: (len(q), 0) for lid, q in self._pending.items() if q}
        for item in self._leased.values():
            pending, leased = out.get(item.launch_id, (0, 0))
            out[item.launch_id] = (pending, leased + 1)
        return out

    @_reads
    def starts(self) -> dict[str, int]:
        """Worker-group starts per launch (a restart by train.max_failures counts)."""
        return dict(self._starts)

    @_changes
    def abandon(self, launch_id: str, reason: str, pending_too: bool = False) -> int:
        """The launch's worker group is gone for good: its leased items (and, with
        `pending_too`, its waiting ones) fail with `reason`. Returns how many failed."""
        gone = [item for item in self._leased.values() if item.launch_id == launch_id]
        if pending_too:
            gone += list(self._pending.pop(launch_id, ()))
        for item in gone:
            self._leased.pop(item.key, None)
            self._traces.pop(item.key, None)
            self._events.append(GivenUp(item, reason))
        return len(gone)

    # ----------------------------------------------------------------------- the workers

    @_changes
    def enter(self, launch_id: str) -> int:
        """Rank 0 of a launch's worker group starts (again, after a worker died: Ray Train's
        `max_failures` restart runs the training function anew). Items the group had leased
        are handed out again, first; one that was already handed out MAX_DELIVERIES times is
        given up: it killed its worker group each time. Returns the start's number."""
        self._starts[launch_id] = n = self._starts.get(launch_id, 0) + 1
        if n > 1:
            again = [item for item in self._leased.values() if item.launch_id == launch_id]
            for item in reversed(again):
                del self._leased[item.key]
                if self._deliveries.get(item.key, 0) >= MAX_DELIVERIES:
                    reason = (
                        f"failed: the worker group died {MAX_DELIVERIES} times running this "
                        "trial (Ray Train restarted it each time; see ray.log in the sweep "
                        "directory)"
                    )
                    self._events.append(GivenUp(item, reason))
                else:
                    self._pending.setdefault(launch_id, deque()).appendleft(item)
        self._events.append(Entered(launch_id, n, time.time()))
        return n

    def lease(
        self, launch_id: str, wait_s: float = 0.0, start: int | None = None
    ) -> WorkItem | str:
        """The launch's next item, else WAIT, or CLOSED once the driver has closed it and
        nothing is left. Where there is neither yet, it waits up to `wait_s` seconds for one
        (an item put or the launch closed wakes it at once: no hand-over waits for a tick).

        `start`: the caller's group start (`enter`'s answer). A lease from an earlier start is
        answered WAIT: Ray finishes a call whose caller died, so a rank 0 that died waiting
        would otherwise take an item that no one runs and no `enter` hands back."""
        stale = lambda: start is not None and start != self._starts.get(launch_id)  # noqa: E731
        with self._changed:
            self._changed.wait_for(
                lambda: stale() or self._pending.get(launch_id) or launch_id in self._closed,
                timeout=wait_s,
            )
            return WAIT if stale() else self._lease_now(launch_id)

    def _lease_now(self, launch_id: str) -> WorkItem | str:
        queue = self._pending.get(launch_id)
        if queue:
            item = queue.popleft()
            self._leased[item.key] = item
            self._traces.pop(item.key, None)  # a delivery's traces are its own
            self._deliveries[item.key] = self._deliveries.get(item.key, 0) + 1
            return item
        return CLOSED if launch_id in self._closed else WAIT

    @_changes
    def ack(self, key: str, row: dict[str, Any]) -> None:
        """Rank 0's answer for a leased item (its results row; a calibration's measurement):
        the item is done."""
        item = self._leased.pop(key, None)
        traces = self._traces.pop(key, None)
        if item is not None:
            self._events.append(Answered(item, {**row, TRACES: traces} if traces else row))

    @_changes
    def attach(self, key: str, rank: int, trace: bytes) -> None:
        """One rank's compressed profiler trace for a leased item (worker/profile.py), sent
        before the item's row; it leaves with the row (under TRACES)."""
        if key in self._leased:
            self._traces.setdefault(key, {})[rank] = trace

    @_changes
    def fail(self, key: str, reason: str) -> None:
        """A rank gives an item up before ending its worker group (a poisoned process, a rank
        stranded in a collective): recorded with the reason, never handed out again."""
        item = self._leased.pop(key, None)
        self._traces.pop(key, None)
        if item is not None:
            self._events.append(GivenUp(item, reason))
