"""Faults lose nothing: a launch that dies is recorded with the worker's own error line, and
the work queue (driver/work_queue.py) hands a lost item out again once, then gives it up."""

from types import SimpleNamespace

from amdahl.driver.launch_watch import launch_error
from amdahl.driver.work_queue import WorkQueue
from amdahl.protocol.items import CLOSED, WAIT, WorkItem, item_key
from amdahl.protocol.queue import Answered, GivenUp


def _failed_launch(tmp_path, error_text: str) -> SimpleNamespace:
    """A Tune trial whose local error file holds `error_text`."""
    path = tmp_path / "error.txt"
    path.write_text(error_text)
    return SimpleNamespace(error_file=str(path), get_error=lambda: None)


def test_launch_error_reads_tunes_local_error_file(tmp_path):
    trial = _failed_launch(
        tmp_path,
        "Failure # 1 (occurred at 2026-11-22_15-39-35)\n"
        "ray.train.WorkerGroupError: Training failed due to worker errors:\n"
        '  File "harness.py", line 1, in train_launch\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n\n",
    )
    assert launch_error(trial) == (
        "launch failed: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_launch_error_names_the_rank_whose_error_it_quotes(tmp_path):
    trial = _failed_launch(
        tmp_path,
        "ray.train.WorkerGroupError: Training failed due to worker errors:\n"
        "[Rank 0 Error Snippet]:\n"
        "amdahl.worker.harness.WorldLost: another rank's process is gone: failed: ...\n"
        "[Rank 7 Error Snippet]:\n"
        "A worker health check failed.\n"
        "The actor is dead because its worker process has died.\n",
    )
    assert launch_error(trial) == (
        "launch failed: rank 7: The actor is dead because its worker process has died."
    )


def test_launch_error_without_any_error_points_to_the_log(tmp_path):
    trial = SimpleNamespace(error_file=str(tmp_path / "missing.txt"), get_error=lambda: None)
    assert "see ray.log in the sweep directory" in launch_error(trial)


def _queue(*keys: str, launch: str = "L") -> tuple[WorkQueue, list[WorkItem]]:
    queue = WorkQueue()
    items = [WorkItem(k, launch, k.split("/")[0], int(k.split("/")[1])) for k in keys]
    queue.put(items)
    return queue, items


def _failed(events: list) -> list[tuple[str, str]]:
    return [(e.item.key, e.reason) for e in events if isinstance(e, GivenUp)]


def test_items_go_out_in_order_and_an_acked_one_is_done():
    queue, items = _queue("a/0/-", "b/0/-")
    queue.enter("L")
    assert queue.lease("L") == items[0]
    queue.ack("a/0/-", {"trial_id": "a"})
    assert queue.lease("L") == items[1]
    assert queue.lease("L") == WAIT  # not closed: the driver may add more (a next rung)
    queue.ack("b/0/-", {"trial_id": "b"})
    queue.close(["L"])
    assert queue.lease("L") == CLOSED
    assert [e.row["trial_id"] for e in queue.drain_events() if isinstance(e, Answered)] == [
        "a",
        "b",
    ]
    assert queue.load() == {}


def test_a_restarted_group_gets_the_item_it_lost_first_and_gives_it_up_the_second_time():
    queue, items = _queue("a/0/-", "b/0/-")
    queue.enter("L")
    assert queue.lease("L") == items[0]  # the worker group dies running a/0
    queue.enter("L")  # Ray Train's max_failures restart runs the training function again
    assert queue.lease("L") == items[0]  # handed out again, before b/0
    queue.enter("L")  # it killed the group a second time
    assert queue.starts() == {"L": 3}
    assert queue.lease("L") == items[1]
    [(key, reason)] = _failed(queue.drain_events())
    assert key == "a/0/-" and "died 2 times" in reason


def test_a_launch_that_died_for_good_fails_only_the_item_it_was_running():
    queue, items = _queue("a/0/-", "b/0/-", "c/0/-")
    queue.enter("L")
    queue.lease("L")
    assert queue.abandon("L", "launch failed: RuntimeError: worker died") == 1
    assert _failed(queue.drain_events()) == [("a/0/-", "launch failed: RuntimeError: worker died")]
    assert queue.load() == {"L": (2, 0)}  # b and c wait for a new launch


def test_a_hopeless_launch_fails_everything_it_had_left():
    queue, _ = _queue("a/0/-", "b/0/-")
    assert queue.abandon("L", "launch failed: no worker group", pending_too=True) == 2
    assert [k for k, _ in _failed(queue.drain_events())] == ["a/0/-", "b/0/-"]


def test_an_item_given_up_by_a_rank_is_recorded_once_and_not_handed_out_again():
    queue, items = _queue("a/0/-", "b/0/-")
    queue.enter("L")
    queue.lease("L")
    queue.fail("a/0/-", "launch failed: ProcessPoisoned: failed: CUDA error")
    queue.ack("a/0/-", {"trial_id": "a"})  # too late: nothing is recorded twice
    queue.enter("L")  # the poisoned group is replaced
    assert queue.lease("L") == items[1]
    events = queue.drain_events()
    assert _failed(events) == [("a/0/-", "launch failed: ProcessPoisoned: failed: CUDA error")]
    assert not [e for e in events if isinstance(e, Answered)]


def test_items_of_other_launches_wait_for_their_own():
    queue, _ = _queue("a/0/-", launch="L")
    assert queue.lease("M") == WAIT
    queue.close(["M"])
    assert queue.lease("M") == CLOSED and queue.load() == {"L": (1, 0)}


def test_the_item_key_is_the_rows_key():
    assert item_key("abc", 1, None) == "abc/1/-" and item_key("abc", 0, 2) == "abc/0/2"


def test_a_cancelled_queue_drops_what_waits_and_lets_the_leased_item_answer():
    queue, items = _queue("a/0/-", "b/0/-", "c/0/-")
    queue.lease("L")
    assert queue.cancel(["L"]) == 2  # b and c: a resume runs them
    assert queue.lease("L") == CLOSED
    queue.ack("a/0/-", {"trial_id": "a"})
    assert [e.row["trial_id"] for e in queue.drain_events() if isinstance(e, Answered)] == ["a"]
