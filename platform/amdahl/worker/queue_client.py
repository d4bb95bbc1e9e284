"""The driver's work queue as rank 0 of a launch calls it: protocol.queue.WorkerQueue over the
Ray actor handle a launch carries (`LaunchConfig.queue`), each call waited for.

The one place a worker names the actor's methods; tests/unit/driver/test_queue_contract.py
checks that these and the actor's (driver/work_queue.py) are the protocol's, signature for
signature.
"""

from __future__ import annotations

from typing import Any

from amdahl.protocol.contract import LaunchConfig
from amdahl.protocol.items import WorkItem


class QueueClient:
    """protocol.queue.WorkerQueue, through a Ray actor handle (one round trip a call)."""

    def __init__(self, handle: Any):
        self._handle = handle

    @classmethod
    def of(cls, launch: LaunchConfig) -> QueueClient:
        return cls(launch.queue)

    def enter(self, launch_id: str) -> int:
        return _wait(self._handle.enter.remote(launch_id))

    def lease(
        self, launch_id: str, wait_s: float = 0.0, start: int | None = None
    ) -> WorkItem | str:
        return _wait(self._handle.lease.remote(launch_id, wait_s, start))

    def attach(self, key: str, rank: int, trace: bytes) -> None:
        _wait(self._handle.attach.remote(key, rank, trace))

    def ack(self, key: str, row: dict[str, Any]) -> None:
        _wait(self._handle.ack.remote(key, row))

    def fail(self, key: str, reason: str) -> None:
        _wait(self._handle.fail.remote(key, reason))


def _wait(ref: Any) -> Any:
    import ray

    return ray.get(ref)
