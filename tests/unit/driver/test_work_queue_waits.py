"""The work queue's long polls (driver/work_queue.py): a waiting `lease` or `poll` returns the
moment there is something for it, not at the end of a tick, and at its limit otherwise."""

import threading
import time

from amdahl.driver.work_queue import WorkQueue
from amdahl.protocol.items import CLOSED, WAIT, WorkItem
from amdahl.protocol.queue import Answered


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
    assert events == [Answered(item, {"trial_id": "a"})]
    assert load == {}
    ack.join()
    start = time.monotonic()
    assert queue.poll(wait_s=0.2) == ([], {})  # nothing new: the limit
    assert time.monotonic() - start >= 0.2


def test_a_lease_from_a_replaced_group_takes_nothing():
    # Ray finishes a call whose caller died: rank 0 of a group that died while its lease
    # waited must not take the item the restarted group's rank 0 is waiting for
    queue, item = WorkQueue(), WorkItem("a/0/-", "L", "a", 0)
    old = queue.enter("L")
    got: list = []
    waiting = threading.Thread(target=lambda: got.append(queue.lease("L", 30.0, start=old)))
    waiting.start()
    new = queue.enter("L")  # the restart wakes the old lease: it answers WAIT at once
    waiting.join(timeout=15.0)
    assert not waiting.is_alive() and got == [WAIT]
    queue.put([item])
    assert queue.lease("L", 0.0, start=old) == WAIT and queue.load() == {"L": (1, 0)}
    assert queue.lease("L", 0.0, start=new) == item
