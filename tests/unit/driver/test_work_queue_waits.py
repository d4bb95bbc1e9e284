"""The work queue's long polls (driver/work_queue.py): a waiting `lease` or `poll` returns the
moment there is something for it, not at the end of a tick, and at its limit otherwise."""

import threading
import time

from amdahl.driver.work_queue import WorkQueue
from amdahl.protocol.items import CLOSED, WAIT, WorkItem


def _later(delay_s: float, call) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), call()))
    thread.start()
    return thread


def test_a_waiting_lease_gets_the_item_the_moment_it_is_put():
    queue, item = WorkQueue(), WorkItem("a/0/-", "L", "a", 0)
    put = _later(0.1, lambda: queue.put([item]))
    start = time.monotonic()
    assert queue.lease("L", wait_s=30.0) == item  # woken by the put, not the 30 s limit
    assert time.monotonic() - start < 15.0
    put.join()


def test_a_waiting_lease_ends_at_its_limit_and_sees_its_launch_closed():
    queue = WorkQueue()
    start = time.monotonic()
    assert queue.lease("L", wait_s=0.2) == WAIT
    assert time.monotonic() - start >= 0.2
    close = _later(0.1, lambda: queue.close(["L"]))
    assert queue.lease("L", wait_s=30.0) == CLOSED
    close.join()


def test_another_launchs_item_does_not_end_a_lease_early():
    queue = WorkQueue()
    put = _later(0.05, lambda: queue.put([WorkItem("b/0/-", "M", "b", 0)]))
    start = time.monotonic()
    assert queue.lease("L", wait_s=0.3) == WAIT
    assert time.monotonic() - start >= 0.3
    put.join()
    assert queue.load() == {"M": (1, 0)}  # still there for its own launch


def test_a_waiting_poll_returns_with_the_row_that_woke_it():
    queue, item = WorkQueue(), WorkItem("a/0/-", "L", "a", 0)
    queue.put([item])
    assert queue.lease("L") == item
    ack = _later(0.1, lambda: queue.ack("a/0/-", {"trial_id": "a"}))
    events, load = queue.poll(wait_s=30.0)
    assert [e[0] for e in events] == ["row"] and events[0][2] == {"trial_id": "a"}
    assert load == {}
    ack.join()
    start = time.monotonic()
    assert queue.poll(wait_s=0.2) == ([], {})  # nothing new: the limit
    assert time.monotonic() - start >= 0.2
