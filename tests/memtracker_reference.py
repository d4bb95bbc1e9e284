"""The independent reference for a trial's tensor bytes: torch's own MemTracker over one step of
a plain training loop (the workload's model, batch and precision; SGD with momentum, as a
trial's), after two steps (the optimizer state exists, DDP has rebuilt its buckets), as after a
trial's warmup. Shared by tests/unit/worker/test_tensor_ledger.py and
benchmarks/memory_check.py."""

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from amdahl import Workload
from amdahl.worker.tensor_ledger import sync_buffer_bytes


def memtracker_peak(workload: Workload, batch: int, precision: str, sync: str = "none") -> int:
    """MemTracker's peak bytes; under `sync: ddp` (a one-rank process group must exist) plus
    DDP's gradient buckets, which MemTracker cannot see (C++ allocations made when DDP is
    built: the ledger's test checks that figure against what DDP allocates)."""
    torch.manual_seed(0)
    model = workload.build_model()
    buckets = 0
    if sync == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
        buckets = sync_buffer_bytes(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = workload.generate("train", batch, seed=0)
    x, y = workload.split_batch({k: torch.from_numpy(v) for k, v in rows.items()})
    dtype = torch.bfloat16 if precision == "bf16" else None

    def step() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = workload.forward(model, x, y)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    return next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"] + buckets
