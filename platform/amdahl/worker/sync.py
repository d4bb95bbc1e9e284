"""Gradient-synchronisation strategies: how replicas on several workers stay consistent.

Worker side. Each strategy is a small object the harness drives with the same calls, so the
timed loop reads the same whatever the strategy:

    model, optimizer = strategy.prepare(model, make_optimizer)
    for micro in range(strategy.micro_steps):         # the accumulate_steps axis's count
        with strategy.micro_context(model, micro):    # DDP no_sync, FSDP2 no reduce-scatter
            ...forward / backward...
    strategy.step(optimizer, scaler)                  # e.g. push/pull to a parameter server
    optimizer.zero_grad(set_to_none=True)
    strategy.after_step(model, step)                  # e.g. local SGD's periodic average
    ...
    strategy.close()                                  # e.g. kill the parameter-server actors

The strategies (`IMPLEMENTATIONS` maps the sweep's `sync` value to its class, each registered by
`@implements(name)`):

- `none`: the measured ceiling; every worker trains alone on its shard, no communication.
- `ddp`: DistributedDataParallel, bucketed all-reduce overlapped with backward.
- `ddp_fp16` / `ddp_bf16`: DDP whose buckets travel as fp16 / bf16 (half the bytes).
- `powersgd`: DDP with rank-r PowerSGD compression of the gradient matrices.
- `accumulate`: DDP that all-reduces once per `options.accumulate_steps` micro-batches
  (`no_sync`): the older form of `ddp` with the `accumulate_steps` axis, kept so old sweep
  files run with their trial ids.
- `local_sgd`: no per-step communication; parameters averaged every `local_sgd_every` steps.
- `zero1`: DDP + ZeroRedundancyOptimizer: optimizer state sharded over ranks (ZeRO stage 1).
- `fsdp`: FSDP2 `fully_shard`: parameters, gradients and optimizer state sharded (ZeRO-3).
- `param_server`: parameter shards held by Ray actors, synchronous push/pull each step
  (the server itself: worker/param_server.py).

Gradient accumulation (the `accumulate_steps` axis) is every strategy's: `micro_steps` passes
per optimizer step, each backward adding its share to the gradients, communicated once. The
DDP family (and zero1) skips the all-reduce on all but the last pass with `no_sync`, fsdp the
reduce-scatter with `set_requires_gradient_sync(False)`; none and local_sgd have no per-step
communication to skip, and param_server pushes the accumulated gradients once, in `step`.

The gradient every rank applies is the equal-weight mean over ranks of each rank's mean-loss
gradient: the per-sample mean only because every rank of a trial gets an equal shard (input.py).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from amdahl.strategies import OPTION_DEFAULTS, micro_steps
from amdahl.worker.param_server import ParamServer, PushPullOptimizer

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(parameter bytes, optimizer-state bytes) this rank holds, counted from its tensors.

    The model-state terms of the ZeRO memory table: sharded parameters (FSDP) count only the
    local shard, and ZeroRedundancyOptimizer only the state of its own partition. Gradients are
    left out (the harness frees them every step). Under `param_server` the optimizer state lives
    on the server actors, so a worker holds none.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.tensor import DTensor

    def nbytes(t: torch.Tensor) -> int:
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    params = sum(nbytes(p) for p in model.parameters())
    state = sum(
        nbytes(v)
        for per_param in inner.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor)
    )
    return params, state


#: The sweep's `sync` value -> the class that implements it (filled by `@implements`).
IMPLEMENTATIONS: dict[str, type[SyncStrategy]] = {}


def implements(name: str) -> Callable[[type[SyncStrategy]], type[SyncStrategy]]:
    """Register a class as the implementation of `sync: name` (its row in strategies.py
    describes it to everything else)."""

    def register(cls: type[SyncStrategy]) -> type[SyncStrategy]:
        IMPLEMENTATIONS[name] = cls
        return cls

    return register


@implements("none")
class SyncStrategy:
    """Base: no communication at all (the `none` ceiling)."""

    name = "none"

    def __init__(self, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1):
        self.options = options
        self.device = device
        if accumulate_steps < 1:
            raise ValueError(f"accumulate_steps: must be >= 1, got {accumulate_steps}")
        #: forward/backward passes per optimizer step (strategies.micro_steps)
        self.micro_steps = micro_steps(self.name, options, accumulate_steps)

    def last_micro(self, micro: int) -> bool:
        """Whether pass `micro` is the step's last, the one whose backward communicates."""
        return micro == self.micro_steps - 1

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, make_optimizer(model.parameters())

    def micro_context(self, model: nn.Module, micro: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def after_step(self, model: nn.Module, step: int) -> None:
        """Called after every optimizer step."""

    def close(self, clean: bool = True) -> None:
        """Release what the strategy holds (actors, hooks' state). `clean` is False after a
        failed trial: then no rank may wait for the others (some never come)."""


@implements("ddp")
class DDPSync(SyncStrategy):
    """torch DistributedDataParallel: bucketed all-reduce overlapped with backward."""

    name = "ddp"

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, bucket_cap_mb=_option(self.options, "bucket_cap_mb")
        )
        self._register_hook(ddp)
        return ddp, make_optimizer(ddp.parameters())

    def micro_context(self, model: nn.Module, micro: int) -> contextlib.AbstractContextManager:
        """No all-reduce (nor comm hook) on all but the step's last pass: the gradients
        accumulate locally and the last backward reduces their sum."""
        if not self.last_micro(micro):
            return _compiled_inner(model).no_sync()
        return contextlib.nullcontext()

    def _register_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        """Subclasses replace DDP's all-reduce of each bucket with a communication hook."""


@implements("ddp_fp16")
class DDPFP16Sync(DDPSync):
    """DDP whose gradient buckets are all-reduced as fp16 (half the bytes, fp16 rounding)."""

    name = "ddp_fp16"

    def _register_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)


@implements("ddp_bf16")
class DDPBF16Sync(DDPSync):
    """DDP whose gradient buckets are all-reduced as bf16 (CUDA + NCCL only)."""

    name = "ddp_bf16"

    def __init__(self, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1):
        super().__init__(options, device, accumulate_steps)
        backend = dist.get_backend()
        if device.type != "cuda" or backend != "nccl":
            raise ValueError(
                f"sync=ddp_bf16 needs CUDA and NCCL (bf16_compress_hook), got device "
                f"{device.type} with backend {backend}; use ddp_fp16"
            )

    def _register_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)


@implements("powersgd")
class PowerSGDSync(DDPSync):
    """DDP with PowerSGD: each gradient matrix travels as two rank-r factors, error feedback on.

    The hook runs vanilla all-reduce before `start_iter` optimizer steps; torch's default (1000)
    would leave a short trial uncompressed, so compression starts at the third step (2 is the
    least PowerSGD accepts with error feedback). Matrices too small to gain 2x are sent whole.
    """

    name = "powersgd"
    start_iter = 2

    def _register_hook(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        #: kept for inspection: `state.compression_stats()` says how much was compressed
        self.state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=_option(self.options, "powersgd_rank"),
            start_powerSGD_iter=self.start_iter,
        )
        ddp.register_comm_hook(self.state, powerSGD_hook.powerSGD_hook)


@implements("accumulate")
class AccumulateSync(DDPSync):
    """DDP with gradient accumulation: all-reduce only on the last of `options.accumulate_steps`
    passes (DDPSync's no_sync; strategies.micro_steps reads the option)."""

    name = "accumulate"

    def __init__(self, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1):
        _positive(options, "accumulate_steps")
        super().__init__(options, device, accumulate_steps)


@implements("local_sgd")
class LocalSGDSync(SyncStrategy):
    """Local SGD: replicas train alone and average their parameters every `local_sgd_every` steps.

    Rank 0's initial parameters and buffers are broadcast at prepare, so replicas start equal
    and agree again right after each average (floating-point parameters and buffers, e.g.
    BatchNorm statistics; optimizer state stays local).
    """

    name = "local_sgd"

    def __init__(self, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1):
        super().__init__(options, device, accumulate_steps)
        self.every = _positive(options, "local_sgd_every")

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        _broadcast_from_rank0(model)
        return model, make_optimizer(model.parameters())

    def after_step(self, model: nn.Module, step: int) -> None:
        if (step + 1) % self.every == 0:
            tensors = [t for t in _module_tensors(model) if t.is_floating_point()]
            _flat_apply(tensors, _mean_over_ranks)


@implements("zero1")
class ZeRO1Sync(DDPSync):
    """DDP + ZeroRedundancyOptimizer: each rank keeps and updates the optimizer state of its
    partition of the parameters, then broadcasts them (ZeRO stage 1: state / world size)."""

    name = "zero1"

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp, probe = super().prepare(model, make_optimizer)
        optimizer_class, kwargs = _optimizer_recipe(probe, self.name)
        sharded = ZeroRedundancyOptimizer(
            ddp.parameters(), optimizer_class=optimizer_class, **kwargs
        )
        return ddp, sharded


@implements("fsdp")
class FSDPSync(SyncStrategy):
    """FSDP2 `fully_shard` on each shard unit (`shard_units`), then on the root.

    Parameters, gradients and optimizer state are sharded over ranks (ZeRO stage 3); each
    child's parameters are all-gathered for its forward and backward, and gradients
    reduce-scattered. The model stays a plain module (every rank must run its forwards).
    Options: `fsdp_reshard_after_forward` (false keeps each child's gathered parameters from
    its forward to its backward: one all-gather fewer, more memory) and `fsdp_param_dtype` /
    `fsdp_reduce_dtype` (the MixedPrecisionPolicy; null leaves FSDP2's default).
    """

    name = "fsdp"

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
        settings = fsdp_settings(self.options)
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh, **settings)
        fully_shard(model, mesh=mesh, **settings)
        return model, make_optimizer(model.parameters())

    def micro_context(self, model: nn.Module, micro: int) -> contextlib.AbstractContextManager:
        """Accumulating, no reduce-scatter on all but the step's last pass: FSDP2 keeps the
        unsharded gradients and the last backward reduces their sum."""
        if self.micro_steps > 1:
            _compiled_inner(model).set_requires_gradient_sync(self.last_micro(micro))
        return contextlib.nullcontext()


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards apart from the root: each child with parameters, and in place
    of a container (`nn.ModuleList`, `nn.ModuleDict`: no forward, which `fully_shard` refuses)
    its own children, so a model's list of blocks (nanoGPT's `transformer.h`, most Hugging
    Face models) becomes a unit per block, as torchtitan shards it."""
    units = []
    for child in module.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            units += shard_units(child)
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


#: `options.fsdp_param_dtype` / `fsdp_reduce_dtype` values as torch dtypes (null: unset).
FSDP_DTYPES = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def fsdp_settings(options: dict[str, Any]) -> dict[str, Any]:
    """`fully_shard`'s keyword arguments for a trial's fsdp options (its defaults where the
    trial's settings leave them out)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "reshard_after_forward": bool(_option(options, "fsdp_reshard_after_forward")),
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=FSDP_DTYPES[_option(options, "fsdp_param_dtype")],
            reduce_dtype=FSDP_DTYPES[_option(options, "fsdp_reduce_dtype")],
        ),
    }


@implements("param_server")
class ParamServerSync(SyncStrategy):
    """Synchronous parameter server (D2L 12.7): parameter shards held by `ps_shards` Ray actors
    (worker/param_server.py's `ParamServer`). Each step every worker pushes its gradients and
    pulls the new parameters; the update runs on the shards. Replicas start from rank 0's
    parameters and buffers; buffers (e.g. BatchNorm statistics) then stay local.

    With an fp16 GradScaler each worker unscales its own gradients; a worker whose gradients
    overflowed pushes a skip mark instead, and then every shard skips that step for everyone,
    as GradScaler would; each worker's scale follows its own overflows.
    """

    name = "param_server"

    def __init__(self, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1):
        super().__init__(options, device, accumulate_steps)
        self.n_shards = _positive(options, "ps_shards")
        #: The trial's shards, from `prepare` on.
        self.server: ParamServer | None = None

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        _broadcast_from_rank0(model)
        params = dict(model.named_parameters())
        optimizer_class, kwargs = _optimizer_recipe(make_optimizer(params.values()), self.name)
        self.server = ParamServer(params, self.n_shards, optimizer_class, kwargs)
        return model, PushPullOptimizer(params.values(), self.server.push_pull)

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
        if self.server is None:
            raise RuntimeError("sync=param_server: step before prepare")
        lr = optimizer.param_groups[0].get("lr")
        if scaler is None:
            self.server.push_pull(lr)
            return
        scaler.unscale_(optimizer)
        self.server.push_pull(lr, skip=not _grads_finite(self.server.params.values()))
        scaler.update()

    def close(self, clean: bool = True) -> None:
        """Kill the server actors (`ParamServer.close`)."""
        if self.server is not None:
            self.server.close(clean)


def make_strategy(
    name: str, options: dict[str, Any], device: torch.device, accumulate_steps: int = 1
) -> SyncStrategy:
    """The strategy object for one trial (fresh per trial: no state leaks between trials), at
    its value of the `accumulate_steps` axis."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown sync strategy {name!r}; known: {', '.join(sorted(IMPLEMENTATIONS))}"
        )
    if name != "none" and not dist.is_initialized():
        raise RuntimeError(f"sync={name} needs torch.distributed to be initialised")
    return IMPLEMENTATIONS[name](options, device, accumulate_steps)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside whatever wrapper a strategy or compiler added."""
    inner = getattr(model, "_orig_mod", model)
    return getattr(inner, "module", inner)


# --------------------------------------------------------------------------- helpers


def _option(options: dict[str, Any], name: str) -> Any:
    """A trial's option, or its default from the strategy table (a trial's settings hold only
    the options its axis values read, and later ones only when set: plan.py's trial identity)."""
    return options.get(name, OPTION_DEFAULTS[name])


def _positive(options: dict[str, Any], option: str) -> int:
    value = _option(options, option)
    if int(value) < 1:
        raise ValueError(f"options.{option}: must be >= 1, got {value}")
    return int(value)


def _compiled_inner(model: nn.Module) -> nn.Module:
    """The module torch.compile wrapped (the DDP module whose no_sync we need), else the model."""
    return getattr(model, "_orig_mod", model)


def _optimizer_recipe(
    optimizer: torch.optim.Optimizer, strategy: str
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The class and constructor settings of an optimizer, to rebuild it sharded or elsewhere.

    `defaults` can hold settings the constructor does not take (AdamW records
    decoupled_weight_decay), so only the constructor's own parameters are kept.
    """
    if len(optimizer.param_groups) != 1:
        raise ValueError(
            f"sync={strategy} rebuilds the optimizer from its class and defaults; "
            f"an optimizer with {len(optimizer.param_groups)} parameter groups is not supported"
        )
    cls = type(optimizer)
    accepted = inspect.signature(cls).parameters
    return cls, {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}


def _module_tensors(model: nn.Module) -> list[torch.Tensor]:
    return list(itertools.chain(model.parameters(), model.buffers()))


@torch.no_grad()
def _flat_apply(tensors: list[torch.Tensor], op: Callable[[torch.Tensor], Any]) -> None:
    """Run a collective once per (device, dtype) on the tensors flattened, then copy back."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        op(flat)
        offset = 0
        for t in group:
            t.detach().copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Make every replica start from rank 0's parameters and buffers (as DDP does)."""
    _flat_apply(_module_tensors(model), lambda flat: dist.broadcast(flat, src=0))


def _mean_over_ranks(flat: torch.Tensor) -> None:
    dist.all_reduce(flat)
    flat.div_(dist.get_world_size())


def _grads_finite(params: Iterable[nn.Parameter]) -> bool:
    flags = [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True
