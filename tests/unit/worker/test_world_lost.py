"""A trial whose world comes apart is never answered as that trial's result (worker/harness.py,
`_check_world_intact`): a peer rank's process dying shows on gloo as a transport error that
`failure_kind` calls 'peer_lost', and a process group that Ray Train destroyed to stop the group
leaves no row to gather. Two plain processes on gloo over loopback, no Ray: the error text is
torch's own, not a copy of it."""

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn_ranks

from amdahl.worker.harness import WorldLost, _check_world_intact, _wait_for_every_rank
from amdahl.worker.training import failure_kind


def _ranks(rank: int, world: int, port: int, out) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30)
    )
    dist.barrier()
    if rank == 1:
        os._exit(1)  # as a segfault or the OOM killer would end it
    try:
        dist.all_reduce(torch.ones(1024))
        out.put(("no error", None, None))
        return
    except RuntimeError as e:
        kind, error = failure_kind(e), f"failed: RuntimeError: {e}"
    try:
        _check_world_intact(2, kind, error)
        lost = None
    except WorldLost as w:
        lost = str(w)
    # Ray Train's stop destroys the process group before it ends the ranks: what is left of
    # the trial is not its row, and the rendezvous count is not waited on
    dist.destroy_process_group()
    try:
        _wait_for_every_rank("item", None, 2)
        destroyed = None
    except WorldLost as w:
        destroyed = str(w)
    out.put((kind, lost, destroyed))


def test_a_dead_peer_and_a_destroyed_group_end_the_rank_without_an_answer():
    procs, out = spawn_ranks(_ranks, 2)
    kind, lost, destroyed = out.get(timeout=90)
    for p in procs:
        p.join(timeout=30)
    assert kind == "peer_lost"
    assert lost is not None and lost.startswith("another rank's process is gone: failed: ")
    assert destroyed is not None and "Ray Train is stopping the worker group" in destroyed


@pytest.mark.parametrize(
    "text, kind",
    [
        (
            "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30116",
            "peer_lost",
        ),
        (
            "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4: Connection reset by peer",
            "peer_lost",
        ),
        ("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 600000ms for recv", "failed"),
        ("Connection closed by peer", "failed"),  # not a collective's transport: the trial's own
    ],
)
def test_only_a_collective_transport_that_lost_its_peer_is_peer_lost(text, kind):
    assert failure_kind(RuntimeError(text)) == kind


def test_a_one_rank_trial_has_no_world_to_lose(monkeypatch):
    # as on a rank whose process group Ray Train destroyed (other tests in this process may
    # have left one of their own)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    _check_world_intact(1, "peer_lost", "failed: RuntimeError: gloo")  # nothing raised
    with pytest.raises(WorldLost, match="destroyed"):
        _check_world_intact(2, None, None)
