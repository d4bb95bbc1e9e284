"""The profiler pass on CUDA (worker/profile.py) and the trace analysis of NCCL's kernels
(analysis/overlap.py): on one GPU the trace is a device trace whose kernels count as
computation; on two GPUs DDP's all-reduce shows as NCCL kernels (`ncclDevKernel_*` or
`ncclKernel_*`) classified as communication, its first bucket overlapping the backward."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from amdahl.analysis.overlap import (
    COMM,
    COMPUTE,
    _comm_threads,
    classify,
    is_device_trace,
    rank_figures,
    read_trace,
    trace_figures,
)
from amdahl.worker.profile import profile_steps_pass

STEPS = 3


def _ddp_step(model: nn.Module, device: torch.device):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device=device)

    def step(_: int) -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).to(device)


def test_a_cuda_pass_records_the_device_kernels(cuda):
    traced = profile_steps_pass(_ddp_step(_model(cuda), cuda), STEPS, cuda)
    assert traced.error is None, traced.error
    trace = read_trace(traced.blob)
    assert is_device_trace(trace)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    kinds = [classify(e, True, _comm_threads(events)) for e in events]
    assert kinds.count(COMPUTE) >= STEPS * 8  # at least one GEMM per layer and step
    assert rank_figures(trace, 0).steps == STEPS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_rank(rank: int, port: int, out: str) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ddp = nn.parallel.DistributedDataParallel(_model(device), device_ids=[rank])
        traced = profile_steps_pass(_ddp_step(ddp, device), STEPS, device)
        assert traced.error is None, traced.error
        Path(out, f"rank{rank}.json.gz").write_bytes(traced.blob)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between ranks needs two GPUs")
def test_nccl_kernels_are_classified_as_communication(tmp_path):
    mp.spawn(_nccl_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = []
    for r in (0, 1):
        trace = read_trace((tmp_path / f"rank{r}.json.gz").read_bytes())
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        nccl = [e for e in kernels if e["name"].startswith(("ncclDevKernel_", "ncclKernel_"))]
        assert nccl, sorted({e["name"] for e in kernels})[:20]
        assert all(classify(e, True) == COMM for e in nccl)
        ranks.append(rank_figures(trace, r))
    figures = trace_figures(ranks)
    assert figures.comm_trace_s > 0
    # 8 layers of 1024 x 1024 are 33.6 MB of gradients: two DDP buckets at the default 25 MB
    # cap, and the first bucket's all-reduce (the last layers') runs on NCCL's stream while
    # backward computes the earlier layers, so some of it overlaps on every rank. (Unverified:
    # the machines lent so far had one GPU.)
    assert figures.comm_overlap > 0, [r.overlap for r in ranks]
    assert all(r.overlap > 0 for r in ranks), [r.overlap for r in ranks]
