"""The fsdp options reach FSDP2's `fully_shard` (worker/sync.py, FSDPSync): on two gloo ranks,
`fsdp_reshard_after_forward: false` leaves the gathered parameters in place after the forward
(the default frees them back to shards), and `fsdp_param_dtype` is the dtype the forward
computes in. Plain processes over loopback, no Ray."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import spawn_ranks
from torch import nn

from amdahl.worker.sync import make_strategy

CASES = (
    {},
    {"fsdp_reshard_after_forward": False},
    {"fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32"},
    {"fsdp_param_dtype": "fp16"},
)


def _after_forward(options: dict) -> tuple[bool, torch.dtype, bool]:
    """(whether the first layer's parameters are still sharded after the forward, the forward
    output's dtype, whether a training step ran and changed them)."""
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    strategy = make_strategy("fsdp", options, torch.device("cpu"))
    model, optimizer = strategy.prepare(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
        lambda params: torch.optim.SGD(params, lr=0.1),
    )
    before = model[0].weight.full_tensor().clone()
    out = model(torch.randn(4, 8))
    sharded = all(isinstance(p, DTensor) for p in model[0].parameters())
    F.cross_entropy(out.float(), torch.tensor([0, 1, 0, 1])).backward()
    optimizer.step()
    moved = not torch.equal(model[0].weight.full_tensor(), before)
    return sharded, out.dtype, moved


def _ranks(rank: int, world: int, port: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    results = [_after_forward(options) for options in CASES]
    dist.barrier()
    if rank == 0:
        out.put(results)
        out.close()
        out.join_thread()  # sent before the exit below, which skips the queue's own flush
    dist.destroy_process_group()
    os._exit(0)  # torch's C++ destructors may abort after gloo (see test_sync.py)


def test_fsdp_options_reach_fully_shard():
    procs, out = spawn_ranks(_ranks, 2)
    results = out.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    default, kept, bf16, fp16 = results
    assert default == (True, torch.float32, True)
    assert kept == (False, torch.float32, True)  # not resharded: the full parameters stay
    assert bf16 == (True, torch.bfloat16, True)
    assert fp16 == (True, torch.float16, True)
