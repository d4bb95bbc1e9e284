"""Gradient-synchronisation strategies: how replicas on several workers stay consistent.

Worker side. Each strategy is a small object the harness drives with the same four calls, so the
timed loop reads the same whatever the strategy:

    model, optimizer = strategy.prepare(model, make_optimizer)
    for micro in range(strategy.micro_steps):
        with strategy.micro_context(model, micro):    # e.g. DDP no_sync while accumulating
            ...forward / backward...
    strategy.step(optimizer)                          # e.g. push/pull to a parameter server
    strategy.after_step(model, step)                  # e.g. local SGD's periodic average

`none` is the measured ceiling: every worker trains alone on its shard, no communication.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class SyncStrategy:
    """Base: no communication at all (the `none` ceiling)."""

    name = "none"
    #: forward/backward passes per optimizer step
    micro_steps = 1

    def __init__(self, options: dict[str, Any], device: torch.device):
        self.options = options
        self.device = device

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

    def close(self) -> None:
        """Release what the strategy holds (actors, hooks' state)."""


class DDPSync(SyncStrategy):
    """torch DistributedDataParallel: bucketed all-reduce overlapped with backward."""

    name = "ddp"

    def prepare(
        self, model: nn.Module, make_optimizer: MakeOptimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, bucket_cap_mb=self.options.get("bucket_cap_mb", 25.0)
        )
        return ddp, make_optimizer(ddp.parameters())


_STRATEGIES: dict[str, type[SyncStrategy]] = {
    "none": SyncStrategy,
    "ddp": DDPSync,
}


def make_strategy(name: str, options: dict[str, Any], device: torch.device) -> SyncStrategy:
    """The strategy object for one trial (fresh per trial: no state leaks between trials)."""
    if name != "none" and not dist.is_initialized():
        raise RuntimeError(f"sync={name} needs torch.distributed to be initialised")
    return _STRATEGIES[name](options, device)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside whatever wrapper a strategy or compiler added."""
    inner = getattr(model, "_orig_mod", model)
    return getattr(inner, "module", inner)
