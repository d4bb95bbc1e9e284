"""A 128-configuration sweep built synthetically, row by row, as the harness would record it:
devices [1, 2] x batch [32, 64, 128, 256] x precision [fp32, bf16] x sync [ddp, ddp_bf16,
local_sgd, none] x prefetch_batches [1, 4], the shape of issue 24's laptop sweep. Step times
come from a small additive model (compute per sample by precision, a data wait that prefetch
hides, communication by strategy, contention at 2 devices), so the ranking has a known answer:
fp32, batch 256, prefetch 4 is fastest; with sync none excluded at p > 1, d2 local_sgd wins.

Two configurations ran out of memory (bf16 b256 ddp_bf16 p1 at both device counts) so the
status column has something to say."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

from report_rows import row

DEVICES = (1, 2)
BATCHES = (32, 64, 128, 256)
PRECISIONS = ("fp32", "bf16")
SYNCS = ("ddp", "ddp_bf16", "local_sgd", "none")
PREFETCH = (1, 4)

#: Seconds of forward+backward per sample (bf16 is slower on a CPU without AMX).
_PER_SAMPLE = {"fp32": 40e-6, "bf16": 70e-6}
#: Exposed communication per step at p = 2.
_COMM = {"ddp": 6e-3, "ddp_bf16": 3.5e-3, "local_sgd": 0.8e-3, "none": 0.0}
_OOM = {("bf16", 256, "ddp_bf16", 1)}


def step_model(devices: int, batch: int, precision: str, sync: str, prefetch: int) -> dict:
    """Per-step phases (seconds): data wait, forward, backward (exposed comm in it), optimizer."""
    contention = 1.0 if devices == 1 else 1.12
    compute = batch * _PER_SAMPLE[precision] * contention
    data = (2.5e-3 if prefetch == 1 else 0.4e-3) * batch / 128
    comm = _COMM[sync] if devices > 1 else 0.0
    return {
        "data_wait_s": data,
        "forward_s": compute / 3,
        "backward_s": 2 * compute / 3 + comm,
        "optimizer_s": 0.6e-3,
    }


def big_sweep_rows() -> list[dict[str, Any]]:
    rows = []
    for p, b, prec, sync, pf in itertools.product(DEVICES, BATCHES, PRECISIONS, SYNCS, PREFETCH):
        tid = hashlib.sha1(f"{p}{b}{prec}{sync}{pf}".encode()).hexdigest()[:10]
        settings = {"precision": prec, "prefetch_batches": pf, "input": "ray_data"}
        if (prec, b, sync, pf) in _OOM:
            oom = row(p, b, sync, trial_id=tid, **settings)
            oom.update(status="oom", error="oom: out of memory", throughput=None)
            rows.append(oom)
            continue
        ph = step_model(p, b, prec, sync, pf)
        wall = sum(ph.values()) + 0.3e-3  # loop overhead outside the timed phases
        step = ph["forward_s"] + ph["backward_s"] + ph["optimizer_s"]
        rows.append(
            row(
                p,
                b,
                sync,
                throughput=b * p / wall,
                steps=50,
                wall=wall,
                trial_id=tid,
                step_time_s=step,
                peak_mem_bytes=(20 + b // 8) * 2**20,
                achieved_flops=b * p / wall * 1.2e6,
                **ph,
                **settings,
            )
        )
    return rows
