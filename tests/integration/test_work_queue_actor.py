"""The work queue as the sweep runs it: a threaded Ray actor (driver/pool.work_queue_actor),
where a rank 0's waiting lease does not hold up the driver's calls and is woken by them."""

import time

import pytest
import ray

from amdahl.driver.pool import work_queue_actor
from amdahl.protocol.items import WorkItem

pytestmark = pytest.mark.integration


def test_a_waiting_lease_is_woken_by_the_drivers_put_through_the_actor(ray_cluster):
    queue = work_queue_actor(launches=1)
    start = ray.get(queue.enter.remote("L"))
    waiting = queue.lease.remote("L", 30.0, start)  # rank 0, waiting for the next rung
    time.sleep(0.5)  # the lease is inside the actor, waiting
    item = WorkItem("a/0/-", "L", "a", 0)
    began = time.monotonic()
    ray.get(queue.put.remote([item]), timeout=10)  # a single-threaded actor would wait 30 s
    assert ray.get(waiting, timeout=10) == item
    assert time.monotonic() - began < 10
    ray.kill(queue)
