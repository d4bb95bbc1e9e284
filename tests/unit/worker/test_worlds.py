"""One worker group, trials of several sizes (worker/worlds.py): each size's process group is
made once and switched back to, so a DDP model built in it (a halving trial kept between rungs)
still reduces after trials of other sizes ran, ranks idle for one size included, and a group a
trial made on its own ranks does not break the sizes made after it. Four plain
processes on gloo over loopback, no Ray."""

import torch
import torch.distributed as dist
from gloo_ranks import spawn_ranks

from amdahl.worker.worlds import TrialWorlds

#: Sizes in the order a rung's items and the next rung's visit them: growing, then again.
SIZES = [2, 4, 1, 2, 4, 1, 2]


def _ranks(rank: int, world: int, port: int, out) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    worlds, models, seen = TrialWorlds(rank, world, 60), {}, []
    for size in SIZES:
        if not worlds.enter(size):
            continue
        if size not in models:  # built once, in its size's group, used again later
            models[size] = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
            if size == 2:  # a group made by the trial's ranks only, as FSDP2's mesh can be
                dist.new_group([0])
        x = torch.full((2, 4), float(rank + 1))
        models[size](x).sum().backward()  # DDP's all-reduce, on the group it was built in
        grad = models[size].module.weight.grad.clone()
        models[size].zero_grad()
        seen.append((size, dist.get_world_size(), float(grad[0, 0])))
    out.put((rank, seen))
    worlds.enter(world)
    dist.barrier()


def test_each_size_keeps_its_group_and_a_model_built_in_it_reduces_later():
    procs, out = spawn_ranks(_ranks, 4)
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, seen in got.items():
        expect = [s for s in SIZES if rank < s]
        assert [size for size, _, _ in seen] == expect
        for size, world, grad in seen:
            assert world == size
            # d(sum of outputs)/d(weight) is 2 (rank + 1) on each rank; averaged over exactly
            # the size's ranks 0..size-1: size + 1
            assert grad == size + 1
