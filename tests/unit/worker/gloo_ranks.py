"""Plain processes on gloo over loopback, no Ray: the unit tests' stand-in for a worker group."""

import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def spawn_ranks(target: Callable[..., None], world: int) -> tuple[list[Any], Any]:
    """Start `world` spawned processes, each running target(rank, world, port, out) with one
    free loopback port for their store; returns (the processes, the queue they answer on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    return procs, out
