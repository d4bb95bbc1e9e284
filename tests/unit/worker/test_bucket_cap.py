"""`options.bucket_cap_mb` reaches DDP (worker/sync.py, DDPSync): on two gloo ranks, a model of
~4 MB of gradients all-reduces in more calls per optimizer step with 1 MB buckets than with
DDP's default 25 MB, counted in the profiler's record of the collectives (not timed). Plain
processes over loopback, no Ray."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import spawn_ranks
from torch import nn
from torch.profiler import ProfilerActivity, profile

from amdahl.worker.sync import make_strategy

STEPS = 2
#: Four 512 x 512 layers: 4 x 1 MiB of fp32 gradients.
WIDTH, LAYERS = 512, 4


def _all_reduces_per_step(bucket_cap_mb: float) -> float:
    """The all-reduce calls per optimizer step of DDPSync at this bucket size."""
    torch.manual_seed(0)
    strategy = make_strategy("ddp", {"bucket_cap_mb": bucket_cap_mb}, torch.device("cpu"))
    model, optimizer = strategy.prepare(
        nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))),
        lambda params: torch.optim.SGD(params, lr=0.1),
    )
    x = torch.randn(8, WIDTH)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            F.mse_loss(model(x), x).backward()
            strategy.step(optimizer, None)
            optimizer.zero_grad(set_to_none=True)
    calls = sum(1 for e in prof.events() if e.name.startswith("c10d::allreduce"))
    strategy.close()
    return calls / STEPS


def _ranks(rank: int, world: int, port: int, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    out.put((rank, {mb: _all_reduces_per_step(mb) for mb in (1.0, 25.0)}))
    dist.barrier()
    dist.destroy_process_group()


def test_smaller_buckets_make_more_all_reduce_calls_per_step():
    procs, out = spawn_ranks(_ranks, 2)
    ranks = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    small, default = ranks[0][1.0], ranks[0][25.0]
    # 4 MiB of gradients: several 1 MB buckets, one or two of 25 MB (DDP's first is 1 MB)
    assert default >= 1
    assert small >= 2 * default, (small, default)
