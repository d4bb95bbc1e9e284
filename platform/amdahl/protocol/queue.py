"""The work queue's contract: the calls a launch's rank 0 makes on the driver's WorkQueue actor
(driver/work_queue.py), and the events the queue hands the driver, as types.

A worker holds only a Ray actor handle (`LaunchConfig.queue`) and calls the queue through
worker.queue_client.QueueClient, whose methods are these; tests/unit/driver/test_queue_contract.py
checks that the actor's class and the client both have exactly these signatures, so a method
renamed on one side fails a test instead of a launch.

Pure: plain data and a Protocol, no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from amdahl.protocol.items import WorkItem

#: The key `platform calibrate`'s rank 0 reports its measurement under, as one JSON value in
#: the Train result (worker/calibration_measurement.py writes it, driver/calibrate.py reads it).
CALIBRATION_RESULT_KEY = "amdahl_calibration"


class WorkerQueue(Protocol):
    """What rank 0 of a launch calls on the queue, in the order of a launch's life."""

    def enter(self, launch_id: str) -> int:
        """The worker group starts (again): the start's number."""
        ...

    def lease(
        self, launch_id: str, wait_s: float = 0.0, start: int | None = None
    ) -> WorkItem | str:
        """The next item, else items.WAIT, or items.CLOSED once nothing more will come."""
        ...

    def attach(self, key: str, rank: int, trace: bytes) -> None:
        """One rank's profiler trace for a leased item, before its row."""
        ...

    def ack(self, key: str, row: dict[str, Any]) -> None:
        """The leased item's answer: its results row (a calibration's measurement)."""
        ...

    def fail(self, key: str, reason: str) -> None:
        """The leased item given up, with the reason, never handed out again."""
        ...


@dataclass(frozen=True)
class Entered:
    """A launch's worker group started (its `start`-th time) at Unix time `unix_s`."""

    launch_id: str
    start: int
    unix_s: float


@dataclass(frozen=True)
class Answered:
    """A leased item's answer came back: its row (with TRACES where ranks attached any)."""

    item: WorkItem
    row: dict[str, Any]


@dataclass(frozen=True)
class GivenUp:
    """An item that will not be answered, and why (a failed rank, a dead worker group)."""

    item: WorkItem
    reason: str


#: What the driver drains from the queue, in order.
QueueEvent = Entered | Answered | GivenUp
