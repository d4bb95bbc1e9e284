"""The parameter server behind `sync: param_server` (D2L 12.7): parameter shards held by Ray
actors, and each worker's side of the synchronous push/pull round.

Keys are parameter names, spread over the shards by size (`assign_shards`). Each step every
worker pushes its gradients to every shard in one call and gets the new parameters back (one
`ray.get` per step): a shard (`_ParamShard`) waits for the pushes of all workers, averages them,
applies the user's optimizer (its class and settings, rebuilt on the server) and answers
everyone. Rank 0 creates the actors (num_cpus=0: the planner keeps no CPU for them) under a
per-trial name it broadcasts; the other ranks look them up by name; `ParamServer.close` kills
them.

Worker side. The strategy the timed loop drives is worker/sync.py's `ParamServerSync`: it holds
a `ParamServer` and hands the loop a `PushPullOptimizer`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

#: Ray namespace of the parameter-server actors, so that workers started as separate Ray jobs
#: find them too; names are unique per trial.
_PS_NAMESPACE = "amdahl"


class ParamServer:
    """One trial's parameter-server shards as one rank sees them. Every rank of the trial
    constructs it together (collective): rank 0 creates the actors, the others find them by the
    name rank 0 broadcasts."""

    def __init__(
        self,
        params: dict[str, nn.Parameter],
        n_shards: int,
        optimizer_class: type[torch.optim.Optimizer],
        optimizer_kwargs: dict[str, Any],
    ):
        import ray

        self.params = params
        self.keys = assign_shards({k: p.numel() for k, p in params.items()}, n_shards)
        self.actors: list[Any] = []
        self.owner = False  # rank 0, once its actors are up: `close` kills them
        rank, world = dist.get_rank(), dist.get_world_size()
        prefix = [f"amdahl-ps-{uuid.uuid4().hex}" if rank == 0 else None]
        dist.broadcast_object_list(prefix, src=0)
        names = [f"{prefix[0]}-{i}" for i in range(len(self.keys))]
        if rank == 0:
            server = ray.remote(num_cpus=0)(_ParamShard)
            self.actors = [
                server.options(name=name, namespace=_PS_NAMESPACE).remote(
                    {k: _to_numpy(params[k]) for k in keys},
                    optimizer_class,
                    optimizer_kwargs,
                    world,
                )
                for name, keys in zip(names, self.keys, strict=True)
            ]
            ray.get([actor.ready.remote() for actor in self.actors])
            self.owner = True
        dist.barrier()
        if rank != 0:
            self.actors = [ray.get_actor(name, namespace=_PS_NAMESPACE) for name in names]

    @torch.no_grad()
    def push_pull(self, lr: float | None, skip: bool = False) -> None:
        """One synchronous round; `lr` (the worker optimizer's rate, which the harness's
        schedule sets) is applied on the shards, which own the real optimizer. `skip`: push a
        skip mark instead of gradients (this worker's fp16 gradients overflowed)."""
        import ray

        pushes = [
            None
            if skip
            else {
                k: _to_numpy(self.params[k].grad) for k in keys if self.params[k].grad is not None
            }
            for keys in self.keys
        ]
        answers = ray.get(
            [
                actor.push_pull.remote(push, lr)
                for actor, push in zip(self.actors, pushes, strict=True)
            ]
        )
        for answer in answers:
            for k, value in answer.items():
                _copy_into(self.params[k], value)

    def close(self, clean: bool = True) -> None:
        """Kill the server actors once every rank is past its last step (a barrier); after a
        failed trial at once, without the barrier."""
        import ray

        if self.actors and clean:
            dist.barrier()
        if self.owner:
            for actor in self.actors:
                ray.kill(actor, no_restart=True)
        self.actors, self.owner = [], False


class _ParamShard:
    """One parameter-server shard: the key-value store of D2L 12.7.4 for the keys it owns.

    Synchronous rounds: a round closes when all `world` workers have pushed; the mean of their
    gradients (keys nobody pushed keep no gradient) updates the parameters with the optimizer,
    unless a worker pushed a skip mark (None: its fp16 gradients overflowed), and every
    worker's call then returns the new parameters. Runs as an async Ray actor so that the
    waiting calls do not block each other.
    """

    def __init__(
        self,
        params: dict[str, np.ndarray],
        optimizer_class: type[torch.optim.Optimizer],
        optimizer_kwargs: dict[str, Any],
        world: int,
    ):
        self._params = {k: nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
        self._optimizer = optimizer_class(list(self._params.values()), **optimizer_kwargs)
        self._world = world
        self._sums: dict[str, np.ndarray] = {}
        self._pushes = 0
        self._skip = False
        self._closed: asyncio.Event | None = None

    def ready(self) -> int:
        return len(self._params)

    async def push_pull(
        self, grads: dict[str, np.ndarray] | None, lr: float | None = None
    ) -> dict[str, np.ndarray]:
        if self._closed is None:
            self._closed = asyncio.Event()
        closed = self._closed
        if grads is None:
            self._skip = True
        else:
            for k, g in grads.items():
                if k in self._sums:
                    self._sums[k] += g
                else:
                    self._sums[k] = np.array(g, dtype=np.float32)
        self._pushes += 1
        if self._pushes == self._world:
            self._apply(lr)
            self._closed = None
            closed.set()
        else:
            await closed.wait()
        # Views of the parameters are safe to return: the next update needs every worker's
        # next push, which each worker sends only after it has received this answer.
        return {k: p.detach().numpy() for k, p in self._params.items()}

    def _apply(self, lr: float | None) -> None:
        if lr is not None:
            for group in self._optimizer.param_groups:
                group["lr"] = lr
        if not self._skip:
            for k, p in self._params.items():
                total = self._sums.get(k)
                p.grad = None if total is None else torch.from_numpy(total).div_(self._world)
            self._optimizer.step()
        self._sums, self._pushes, self._skip = {}, 0, False


class PushPullOptimizer(torch.optim.Optimizer):
    """The worker's optimizer under `param_server`: it holds no state; `step` pushes gradients
    and pulls parameters (the update itself runs on the servers). It still serves zero_grad and
    GradScaler.unscale_."""

    def __init__(self, params: Iterable[nn.Parameter], push_pull: Callable[[float | None], None]):
        super().__init__(list(params), {})
        self._push_pull_fn = push_pull

    def step(self, closure: Callable[[], float] | None = None) -> None:
        if closure is not None:
            raise ValueError("sync=param_server does not support optimizer closures")
        self._push_pull_fn(self.param_groups[0].get("lr"))


def assign_shards(sizes: dict[str, int], n_shards: int) -> list[list[str]]:
    """Spread keys (parameter names -> element counts) over at most `n_shards` shards by size.

    Largest first, each onto the least-loaded shard (ties: lowest shard index), so every rank
    computes the same assignment; shards left empty (more shards than keys) are dropped.
    """
    loads = [0] * n_shards
    shards: list[list[str]] = [[] for _ in range(n_shards)]
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        target = loads.index(min(loads))
        shards[target].append(key)
        loads[target] += sizes[key]
    return [keys for keys in shards if keys]


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    """fp32 host copy of a tensor for Ray (a view when it already is fp32 on the CPU)."""
    return t.detach().float().cpu().numpy()


def _copy_into(param: torch.Tensor, value: np.ndarray) -> None:
    if param.device.type == "cpu" and param.dtype == torch.float32:
        np.copyto(param.detach().numpy(), value)
    else:
        param.detach().copy_(torch.tensor(value, device=param.device))
