"""The one table of gradient-sync strategies: what each is called, which `options` it reads (and
their defaults), what it needs, where its communication lands in a step and how much of it there
is. Pure data, no torch: the spec schema, the planner, the worker-side harness, the report's
diagnosis and its step-time model all read it, so a strategy is described once.

Adding a strategy (docs/architecture.md, "How to add ...", "A sync strategy"): a row here, its
`SyncStrategy` class in worker/sync.py registered with `@implements(name)`, a test and its name in
the `grid.sync` description (spec/schema.py, printed in docs/sweep-file.md); a strategy that is not
a plain all-reduce of the gradient (no `wire_factor`) also needs its bytes in analysis/comm.py's
`comm_volume`, an option it adds a field of spec.OptionsSpec, and a state it holds other than a
replica's its `memory` shape (what analysis/memory_model.py predicts per rank).
tests/unit/test_strategies.py checks that worker/sync.py implements exactly the strategies listed
here, that the step-time model has a volume for each and that every option here is a field of
spec.OptionsSpec with this default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Every option a strategy may read, with its default (spec.OptionsSpec takes its defaults here).
OPTION_DEFAULTS: dict[str, Any] = {
    "bucket_cap_mb": 25.0,
    "powersgd_rank": 1,
    "accumulate_steps": 4,
    "local_sgd_every": 4,
    "ps_shards": 2,
    "fsdp_reshard_after_forward": True,
    "fsdp_param_dtype": None,
    "fsdp_reduce_dtype": None,
}

#: The options each `compile` value reads (the sync strategies' are their rows' `options`).
COMPILE_OPTIONS: dict[str, tuple[str, ...]] = {"inductor": ("compile_mode", "compile_cache")}

#: The timed phases of a step, in order.
ALL_PHASES = ("forward_s", "backward_s", "optimizer_s")


@dataclass(frozen=True)
class MemoryShape:
    """What one rank of a strategy holds of the model's state (analysis/memory_model.py)."""

    #: "replicated" on every rank, or "sharded" 1/p (FSDP2).
    parameters: str = "replicated"
    #: "replicated", "sharded" 1/p (ZeRO-1, FSDP2), or "remote" (on parameter-server actors).
    optimizer: str = "replicated"
    #: Whether DDP's gradient buckets (a flat copy of the gradients) sit beside the model.
    buckets: bool = False


_REPLICATED = MemoryShape()
_DDP_MEMORY = MemoryShape(buckets=True)


@dataclass(frozen=True)
class Strategy:
    """One gradient-sync strategy, as everything outside its implementation sees it."""

    name: str
    #: What it does, in one line (`platform plan`).
    summary: str
    #: The `options` it reads; only these enter a trial's settings and id.
    options: tuple[str, ...] = ()
    #: Why it cannot run without CUDA, or None when it can.
    needs_cuda: str | None = None
    #: Timed phases that contain its communication (where exposed communication lands).
    comm_phases: tuple[str, ...] = ALL_PHASES
    #: Bytes on the wire per gradient byte when it is a plain ring all-reduce of the gradient
    #: each step (the report's ring model); None when that model does not describe it.
    wire_factor: float | None = None
    #: Whether optimizer state or parameters are sharded across ranks (per-device memory then
    #: depends on the device count).
    sharded: bool = False
    #: The option that sets forward/backward passes per optimizer step, or None: the
    #: `accumulate_steps` axis's (`micro_steps`).
    micro_steps_option: str | None = None
    #: False only for `none`, the no-communication ceiling.
    communicates: bool = True
    #: Whether it communicates on one device too (the parameter server's actors are remote).
    communicates_alone: bool = False
    #: Whether the harness's `comm_s` (DDP's all-reduce timed against `no_sync`) measures all
    #: of its communication; the step model then takes step minus `comm_s` as compute.
    comm_s_covers: bool = False
    #: Axis values it cannot run with, as (axis, value, reason); the planner refuses them.
    incompatible: tuple[tuple[str, str, str], ...] = ()
    #: What a rank holds of the model's state (the memory model's terms).
    memory: MemoryShape = _REPLICATED


_DDP = ("bucket_cap_mb",)
_BACKWARD = ("backward_s",)

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "ddp",
            "DistributedDataParallel: bucketed ring all-reduce of the gradient, overlapped "
            "with backward",
            options=_DDP,
            comm_phases=_BACKWARD,
            wire_factor=1.0,
            comm_s_covers=True,
            memory=_DDP_MEMORY,
        ),
        Strategy(
            "ddp_fp16",
            "DDP with fp16_compress_hook: the gradient is all-reduced as 2-byte values",
            options=_DDP,
            comm_phases=_BACKWARD,
            wire_factor=0.5,
            comm_s_covers=True,
            memory=_DDP_MEMORY,
        ),
        Strategy(
            "ddp_bf16",
            "DDP with bf16_compress_hook (CUDA and NCCL only)",
            options=_DDP,
            needs_cuda="bf16_compress_hook needs CUDA and NCCL (it raises TypeError on gloo); "
            "use ddp_fp16 on CPU",
            comm_phases=_BACKWARD,
            wire_factor=0.5,
            comm_s_covers=True,
            memory=_DDP_MEMORY,
        ),
        Strategy(
            "powersgd",
            "DDP with PowerSGD: rank-r low-rank factors of the gradient are all-reduced",
            options=(*_DDP, "powersgd_rank"),
            comm_phases=_BACKWARD,
            comm_s_covers=True,
            memory=_DDP_MEMORY,
        ),
        Strategy(
            "accumulate",
            "DDP that all-reduces once per `accumulate_steps` micro-batches (no_sync)",
            options=(*_DDP, "accumulate_steps"),
            comm_phases=_BACKWARD,
            wire_factor=1.0,
            micro_steps_option="accumulate_steps",
            comm_s_covers=True,
            memory=_DDP_MEMORY,
        ),
        Strategy(
            "local_sgd",
            "no per-step gradient sync; parameters averaged every `local_sgd_every` steps",
            options=("local_sgd_every",),
            comm_phases=("backward_s", "optimizer_s"),
        ),
        Strategy(
            "zero1",
            "ZeroRedundancyOptimizer: DDP gradients, optimizer state sharded across ranks",
            options=_DDP,
            comm_phases=("backward_s", "optimizer_s"),
            sharded=True,
            memory=MemoryShape(optimizer="sharded", buckets=True),
        ),
        Strategy(
            "fsdp",
            "FSDP2 fully_shard: parameters, gradients and optimizer state sharded",
            options=("fsdp_reshard_after_forward", "fsdp_param_dtype", "fsdp_reduce_dtype"),
            comm_phases=("forward_s", "backward_s"),
            sharded=True,
            incompatible=(
                (
                    "compile",
                    "torchscript",
                    "FSDP2 shards a module through forward hooks, which TorchScript modules do "
                    "not support; use compile eager or inductor with fsdp",
                ),
            ),
            memory=MemoryShape(parameters="sharded", optimizer="sharded"),
        ),
        Strategy(
            "param_server",
            "gradients pushed to `ps_shards` Ray parameter-server actors, parameters pulled",
            options=("ps_shards",),
            comm_phases=("optimizer_s",),
            communicates_alone=True,
            memory=MemoryShape(optimizer="remote"),
        ),
        Strategy(
            "none",
            "no communication at all: each rank trains alone (the throughput ceiling)",
            comm_phases=(),
            communicates=False,
        ),
    )
}

#: Strategy names in table order (the schema's `grid.sync` values).
NAMES: tuple[str, ...] = tuple(STRATEGIES)


def options_read(compile: str, sync: str) -> tuple[str, ...]:
    """The `options` a trial with these compile and sync values reads, in that order."""
    strategy = STRATEGIES.get(sync)
    return (*COMPILE_OPTIONS.get(compile, ()), *(strategy.options if strategy else ()))


def micro_steps(name: str, options: dict[str, Any], accumulate_steps: int) -> int:
    """Forward/backward passes per optimizer step for `name` with these options at this value
    of the `accumulate_steps` axis: the axis's, times the strategy's own (`sync: accumulate`'s
    option; the planner refuses the two together, so at most one of them is not 1)."""
    option = STRATEGIES[name].micro_steps_option
    own = int(options.get(option, OPTION_DEFAULTS[option])) if option else 1
    return accumulate_steps * own
