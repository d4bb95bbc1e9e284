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
  rank on the D2L MLP, whose peak falls there). Its options (FSDP2's documented behaviour):
  `fsdp_reshard_after_forward: false` keeps every unit gathered from its forward to its
  backward, so all of P - P / p instead of two units; `fsdp_param_dtype` bf16/fp16 casts the
  gathered copy (the fp32 shards, the optimizer's, stay), so the gathered parameters count at
  its size, and the forward computes in it, so step(b) shrinks by its size over the probe's
  compute dtype (fp32, or half under a bf16 `precision`); `fsdp_reduce_dtype` changes only
  the transient reduce-scatter input, not the peak (measured with benchmarks/memory_model.py
  --fsdp-options: the MLP and the small GPT at 1 and 2 gloo ranks);
- step(b) = a + k b: what the plain model's step adds at its peak (activations, temporaries,
  the gradients alive then), a straight line through the probe's two batches (ZeRO's paper,
  DeepSpeed's estimators and torch's own MemTracker all take activations as linear in batch);
  with activation checkpointing, the line the probe measured with the blocks checkpointed;
- plus the device's fixed overhead (cuBLAS's workspace, ...), `overhead_bytes`, taken from a
  sweep's own rows where it has measured some (`fit_overhead`), 0 otherwise.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amdahl.strategies import OPTION_DEFAULTS, STRATEGIES

#: Share of the device's memory a trial may be predicted to use before the plan refuses it:
#: the rest covers what the model does not count (allocator fragmentation, the CUDA context).
DEVICE_MEMORY_MARGIN = 0.1
#: `largest_batch` where no batch size changes the memory.
UNBOUNDED_BATCH = 2**31
#: Bytes per element of each `options.fsdp_param_dtype` value.
FSDP_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Bytes per element of the model's parameters, and of what its forward computes in, by
#: `precision` (bf16/fp16 autocast the forward, bf16_weights casts the model; others fp32).
PARAM_BYTES = {"bf16_weights": 2}
COMPUTE_BYTES = {"bf16": 2, "fp16": 2, "bf16_weights": 2}


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
    #: The step line with activation checkpointing, by mode: (intercept, bytes per sample);
    #: measured only where the workload names blocks.
    checkpointed: dict[str, tuple[float, float]] = field(default_factory=dict)

    def step_line(self, checkpointing: str = "none") -> tuple[float, float]:
        """(intercept, bytes per sample) of a step with this checkpointing mode; the plain
        model's where the mode was not measured (the larger figure: never an under-prediction
        from a missing line)."""
        plain = (self.step_intercept, self.step_per_sample)
        return tuple(self.checkpointed.get(checkpointing, plain)) if checkpointing else plain

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
            "checkpointed": {m: list(line) for m, line in self.checkpointed.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryFacts:
        return cls(
            **{
                **d,
                "largest_units": tuple(d["largest_units"]),
                "probe_batches": tuple(d["probe_batches"]),
                "checkpointed": {m: tuple(v) for m, v in d.get("checkpointed", {}).items()},
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


def predict_peak(  # noqa: PLR0913 - a trial's settings, each but the first four defaulted
    facts: MemoryFacts,
    sync: str,
    devices: int,
    batch: float,
    micro_steps: int = 1,
    overhead_bytes: float = 0.0,
    checkpointing: str = "none",
    options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
) -> MemoryPrediction:
    """The peak tensor bytes one rank of a trial holds (the module docstring's sum), at
    `micro_steps` passes per optimizer step (strategies.micro_steps), its step line the one
    the probe measured with its activation `checkpointing`, under its `options` (the fsdp
    ones; None or a missing one: its default) and the `precision` the facts were measured at."""
    shape = STRATEGIES[sync].memory
    intercept, per_sample = facts.step_line(checkpointing)
    p = max(1, devices)
    fsdp = shape.parameters == "sharded"
    shard = (lambda x: x / p) if fsdp else (lambda x: x)
    optimizer = {"replicated": 1.0, "sharded": 1.0 / p, "remote": 0.0}[shape.optimizer]
    held = float(facts.grad_bytes) if micro_steps > 1 else 0.0
    knobs = {**OPTION_DEFAULTS, **(options or {})}
    gathered = _fsdp_gathered(facts, p, knobs, precision) if fsdp else 0.0
    step = max(0.0, intercept + per_sample * batch) * _step_scale(sync, options, precision)
    parts = {
        "parameters": shard(facts.param_bytes),
        "optimizer": facts.optimizer_bytes * optimizer,
        "buffers": float(facts.buffer_bytes),
        "buckets": 2.0 * facts.grad_bytes if shape.buckets else 0.0,
        "held gradients": held,
        "gathered parameters": gathered,
        "step": step,
        "device overhead": overhead_bytes,
    }
    return MemoryPrediction(sum(parts.values()), parts)


def _fsdp_gathered(facts: MemoryFacts, p: int, options: dict[str, Any], precision: str) -> float:
    """fsdp's gathered parameters and gradient shards (the module docstring's term) under
    its options: the units gathered at the peak are the two largest, or every one where
    `fsdp_reshard_after_forward` is false (each stays gathered from its forward to its
    backward), held at `fsdp_param_dtype`'s size (FSDP2 casts the gathered copy; its sharded
    parameters stay in their own dtype)."""
    dtype = options["fsdp_param_dtype"]
    ratio = FSDP_DTYPE_BYTES[dtype] / PARAM_BYTES.get(precision, 4) if dtype else 1.0
    reshard = options["fsdp_reshard_after_forward"]
    units = facts.largest_units[:2] if reshard else (facts.param_bytes,)
    return sum(ratio * (u - u / p) for u in units) + facts.grad_bytes / p


def _step_scale(sync: str, options: Mapping[str, Any] | None, precision: str) -> float:
    """What fsdp's `fsdp_param_dtype` makes of the probe's step line (1 elsewhere): the
    forward computes in that dtype, so its activations shrink by its size over the probe's
    compute dtype (`COMPUTE_BYTES`: fp32, or half under a half `precision`, which already
    computes in half); never grows (autocast keeps its own casts under an fp32 param dtype)."""
    dtype = (options or {}).get("fsdp_param_dtype")
    if STRATEGIES[sync].memory.parameters != "sharded" or dtype is None:
        return 1.0
    return min(1.0, FSDP_DTYPE_BYTES[dtype] / COMPUTE_BYTES.get(precision, 4))


def usable_bytes(device_memory_gb: float) -> float:
    """What a trial may be predicted to hold of a device with this much memory."""
    return device_memory_gb * 1e9 * (1 - DEVICE_MEMORY_MARGIN)


def largest_batch(  # noqa: PLR0913 - a trial's settings, as predict_peak takes them
    facts: MemoryFacts,
    sync: str,
    devices: int,
    device_memory_gb: float,
    micro_steps: int = 1,
    overhead_bytes: float = 0.0,
    checkpointing: str = "none",
    options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
) -> int:
    """The largest per-device batch predicted to fit (0: not even one sample)."""
    fixed = predict_peak(
        facts, sync, devices, 0, micro_steps, overhead_bytes, checkpointing, options, precision
    )
    room = usable_bytes(device_memory_gb) - fixed.total
    per_sample = facts.step_line(checkpointing)[1] * _step_scale(sync, options, precision)
    if per_sample <= 0:  # nothing grows with the batch: any fits, or none does
        return 0 if room < 0 else UNBOUNDED_BATCH
    return max(0, int(room // per_sample))


def largest_power_of_two(limit: int) -> int:
    """The largest power of two <= limit (0 when limit < 1)."""
    return 1 << (limit.bit_length() - 1) if limit >= 1 else 0


def fit_overhead(pairs: list[tuple[float, float]]) -> float:
    """The device's fixed overhead from (predicted without it, measured) pairs of a sweep's
    rows: the median of what the measurement holds beyond the prediction, never below 0."""
    if not pairs:
        return 0.0
    return max(0.0, statistics.median(measured - predicted for predicted, measured in pairs))


@dataclass(frozen=True)
class Overhead:
    """The device's fixed overhead as a sweep's own rows show it: what the measured peaks hold
    beyond the plan's predictions (which leave it out), over `rows` ok rows with both figures.
    On a GPU: cuBLAS's workspaces and what else the allocator holds that no tensor of the model
    does; on CPU, where the ledger counts tensors only, the model's own bias."""

    bytes: float = 0.0
    rows: int = 0


def overhead_from_rows(rows: list[dict[str, Any]]) -> Overhead:
    """`Overhead` from results rows (dicts): ok rows with a measured and a predicted peak."""
    pairs = [
        (float(r["predicted_peak_mem_bytes"]), float(r["peak_mem_bytes"]))
        for r in rows
        if r.get("status") == "ok"
        and _present(r.get("predicted_peak_mem_bytes"))
        and _present(r.get("peak_mem_bytes"))
    ]
    return Overhead(fit_overhead(pairs), len(pairs))


def _present(value: Any) -> bool:
    """A number in a results row: not None, not NaN (pandas' null in a float column)."""
    return value is not None and value == value


def alternatives(  # noqa: PLR0913 - a trial's settings, as predict_peak takes them
    facts: MemoryFacts,
    bf16: MemoryFacts | None,
    sync: str,
    devices: int,
    batch: float,
    micro_steps: int = 1,
    checkpointing: str = "none",
    options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
) -> list[tuple[str, float]]:
    """What the same trial would hold per device another way, largest saving first, as
    (what to change, predicted peak bytes): the sharding strategies at more than one device,
    bf16 where the probe measured it and the trial is fp32, activation checkpointing where the
    probe measured it, and half the batch (the same global batch with twice the micro-steps,
    or half the samples per step), each at the trial's `micro_steps`. Only changes that hold
    less than the trial's own prediction. Each keeps the trial's `options` (fsdp's count
    where the change keeps fsdp) and `precision`, but bf16."""

    def peak(
        f: MemoryFacts, s: str, b: float, mode: str = checkpointing, at: str = precision
    ) -> float:
        return predict_peak(f, s, devices, b, micro_steps, 0.0, mode, options, at).total

    out = [
        (f"sync {other}", peak(facts, other, batch))
        for other in ("zero1", "fsdp")
        if devices > 1 and other != sync and other in STRATEGIES
    ]
    if bf16 is not None:
        out.append(("bf16", peak(bf16, sync, batch, at="bf16")))
    out += [
        (f"activation_checkpointing {mode}", peak(facts, sync, batch, mode))
        for mode in facts.checkpointed
        if mode != checkpointing
    ]
    if batch >= 2:
        out.append((f"batch {int(batch) // 2}", peak(facts, sync, batch // 2)))
    own = peak(facts, sync, batch)
    return sorted((x for x in out if x[1] < own), key=lambda x: x[1])
