"""The memory model: a trial's peak tensor bytes per rank, predicted before it runs.

Pure (no torch): the planner, `platform predict` and the report use it alike. Its inputs are a
workload's `MemoryFacts`, measured once per workload, parameters, precision and optimizer by the
probe (workload/memory_probe.py: the plain model through the tensor ledger at two small
batches), and a trial's settings. Per rank, with P, G, O and B the plain model's parameter,
gradient, optimizer-state and buffer bytes, p the trial's devices and b its per-device batch:

    peak = params + optimizer + B + buckets + held gradients + fsdp's gathered + step(b)

- params: P, or P / p under fsdp (FSDP2 shards every parameter);
- optimizer: O; O / p under zero1 and fsdp (ZeRO-1 and -3); none under param_server (its state
  lives on the server actors);
- buckets: 2G under the strategies built on DDP: its gradient buckets (one flat copy of the
  gradients, made when DDP wraps the model), and the gradients its reducer copies into them,
  alive beside them at the end of the backward (measured with the tensor ledger at one rank:
  2.0 G on the D2L MLP, whose peak falls there; 1.4 G on a small GPT, whose peak falls
  earlier, where 2G over-predicts by under 5%);
- held gradients: G when a step accumulates several micro-batches (the `accumulate_steps`
  axis, or `sync: accumulate`), whose gradients stay alive while the next forward runs; under
  fsdp too, where FSDP2 keeps the unsharded gradients until the step's last backward
  reduce-scatters them (`set_requires_gradient_sync(False)`);
- fsdp's gathered: the two largest shard units' full parameters (the one computing and the
  one prefetched), less their shards; and its gradient shards, G / p, the reduce-scatter's
  output held beside a unit's full gradients at the end of its backward (measured: 1 G at one
  rank on the D2L MLP, whose peak falls there);
- step(b) = a + k b: what the plain model's step adds at its peak (activations, temporaries,
  the gradients alive then), a straight line through the probe's two batches (ZeRO's paper,
  DeepSpeed's estimators and torch's own MemTracker all take activations as linear in batch);
- plus the device's fixed overhead (cuBLAS's workspace, ...), `overhead_bytes`, taken from a
  sweep's own rows where it has measured some (`fit_overhead`), 0 otherwise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from amdahl.strategies import STRATEGIES

#: Share of the device's memory a trial may be predicted to use before the plan refuses it:
#: the rest covers what the model does not count (allocator fragmentation, the CUDA context).
DEVICE_MEMORY_MARGIN = 0.1
#: `largest_batch` where no batch size changes the memory.
UNBOUNDED_BATCH = 2**31


@dataclass(frozen=True)
class MemoryFacts:
    """What the probe measured of a workload's plain model at one precision and optimizer."""

    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    #: The two largest shard units' parameter bytes (FSDP2 shards each child module with
    #: parameters, then the root's remainder), largest first.
    largest_units: tuple[int, ...]
    #: What a step adds at its peak: `step_intercept + step_per_sample * batch` bytes.
    step_intercept: float
    step_per_sample: float
    #: The two batches the line was measured at, and how (eager, ...).
    probe_batches: tuple[int, int] = (8, 32)
    source: str = "eager"

    def as_dict(self) -> dict[str, Any]:
        return {
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "buffer_bytes": self.buffer_bytes,
            "largest_units": list(self.largest_units),
            "step_intercept": self.step_intercept,
            "step_per_sample": self.step_per_sample,
            "probe_batches": list(self.probe_batches),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryFacts:
        return cls(
            **{
                **d,
                "largest_units": tuple(d["largest_units"]),
                "probe_batches": tuple(d["probe_batches"]),
            }
        )


@dataclass(frozen=True)
class MemoryPrediction:
    """A trial's predicted peak per rank, and its parts (bytes, by what holds them)."""

    total: float
    parts: dict[str, float] = field(default_factory=dict)

    def dominant(self) -> str:
        """The part that holds the most."""
        return max(self.parts, key=lambda k: self.parts[k])


def predict_peak(
    facts: MemoryFacts,
    sync: str,
    devices: int,
    batch: float,
    micro_steps: int = 1,
    overhead_bytes: float = 0.0,
) -> MemoryPrediction:
    """The peak tensor bytes one rank of a trial holds (the module docstring's sum), at
    `micro_steps` passes per optimizer step (strategies.micro_steps)."""
    shape = STRATEGIES[sync].memory
    p = max(1, devices)
    fsdp = shape.parameters == "sharded"
    shard = (lambda x: x / p) if fsdp else (lambda x: x)
    optimizer = {"replicated": 1.0, "sharded": 1.0 / p, "remote": 0.0}[shape.optimizer]
    held = float(facts.grad_bytes) if micro_steps > 1 else 0.0
    gathered = sum(u - u / p for u in facts.largest_units[:2]) if fsdp else 0.0
    gathered += facts.grad_bytes / p if fsdp else 0.0
    parts = {
        "parameters": shard(facts.param_bytes),
        "optimizer": facts.optimizer_bytes * optimizer,
        "buffers": float(facts.buffer_bytes),
        "buckets": 2.0 * facts.grad_bytes if shape.buckets else 0.0,
        "held gradients": held,
        "gathered parameters": gathered,
        "step": max(0.0, facts.step_intercept + facts.step_per_sample * batch),
        "device overhead": overhead_bytes,
    }
    return MemoryPrediction(sum(parts.values()), parts)


def usable_bytes(device_memory_gb: float) -> float:
    """What a trial may be predicted to hold of a device with this much memory."""
    return device_memory_gb * 1e9 * (1 - DEVICE_MEMORY_MARGIN)


def largest_batch(
    facts: MemoryFacts,
    sync: str,
    devices: int,
    device_memory_gb: float,
    micro_steps: int = 1,
    overhead_bytes: float = 0.0,
) -> int:
    """The largest per-device batch predicted to fit (0: not even one sample)."""
    fixed = predict_peak(facts, sync, devices, 0, micro_steps, overhead_bytes).total
    room = usable_bytes(device_memory_gb) - fixed
    if facts.step_per_sample <= 0:  # nothing grows with the batch: any fits, or none does
        return 0 if room < 0 else UNBOUNDED_BATCH
    return max(0, int(room // facts.step_per_sample))


def largest_power_of_two(limit: int) -> int:
    """The largest power of two <= limit (0 when limit < 1)."""
    return 1 << (limit.bit_length() - 1) if limit >= 1 else 0


def fit_overhead(pairs: list[tuple[float, float]]) -> float:
    """The device's fixed overhead from (predicted without it, measured) pairs of a sweep's
    rows: the median of what the measurement holds beyond the prediction, never below 0."""
    if not pairs:
        return 0.0
    return max(0.0, statistics.median(measured - predicted for predicted, measured in pairs))
