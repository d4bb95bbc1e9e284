"""The work queue's contract (protocol.queue.WorkerQueue) holds on both sides of the line: the
driver's actor class implements every call a worker makes, with the same signature, and the
worker's client makes exactly those calls. A method renamed or re-typed on one side fails here,
not in a launch."""

import inspect
import typing

import pytest

from amdahl.driver.work_queue import WorkQueue
from amdahl.protocol.queue import Answered, Entered, GivenUp, QueueEvent, WorkerQueue
from amdahl.worker.queue_client import QueueClient

CALLS = [
    name
    for name, member in vars(WorkerQueue).items()
    if inspect.isfunction(member) and not name.startswith("_")
]


#: The parameter Ray adds to every method of a class it makes an actor of, in place, in the
#: process that does so (its tracing hook): the session's integration tests make the queue's.
RAY_ADDED = "_ray_trace_ctx"


def _signature(cls: type, name: str) -> list[tuple[str, object, object]]:
    sig = inspect.signature(getattr(cls, name))
    hints = typing.get_type_hints(getattr(cls, name))
    params = [
        (p.name, hints.get(p.name), p.default)
        for p in sig.parameters.values()
        if p.name != RAY_ADDED
    ]
    return [*params, ("return", hints.get("return"), None)]


def test_the_protocol_names_the_five_calls_a_worker_makes():
    assert sorted(CALLS) == ["ack", "attach", "enter", "fail", "lease"]


@pytest.mark.parametrize("side", [WorkQueue, QueueClient])
@pytest.mark.parametrize("name", CALLS)
def test_each_side_has_each_call_with_the_protocols_signature(side, name):
    assert _signature(side, name) == _signature(WorkerQueue, name)


def test_the_comparison_sees_through_what_ray_adds_to_an_actor_class():
    """In one session the integration tests make the queue a Ray actor, and Ray then adds a
    tracing parameter to every method of the class: the contract is about the rest."""
    import ray

    class Probe:
        def enter(self, launch_id: str) -> int:
            return 1

    ray.remote(Probe)  # patches Probe's methods in place, as the driver's actor does WorkQueue's
    assert _signature(Probe, "enter") == _signature(WorkerQueue, "enter")


def test_the_client_makes_no_call_the_protocol_lacks():
    own = {n for n, m in vars(QueueClient).items() if inspect.isfunction(m) and n[0] != "_"}
    assert own == set(CALLS)


def test_the_driver_drains_typed_events_and_a_drain_empties_the_queue():
    queue = WorkQueue()
    assert queue.enter("L") == 1
    [entered] = queue.drain_events()
    assert isinstance(entered, Entered) and (entered.launch_id, entered.start) == ("L", 1)
    assert queue.drain_events() == []  # taken: a second drain finds nothing
    assert set(typing.get_args(QueueEvent)) == {Entered, Answered, GivenUp}
    with pytest.raises(AttributeError):
        entered.start = 2  # frozen: an event is what happened
