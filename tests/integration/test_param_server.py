"""sync=param_server on a local Ray cluster: two gloo worker processes join it as Ray drivers.

The parameter server applies the same optimizer to the same averaged gradients as DDP does, so
after the same steps on the same data its replicas must equal DDP's.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from amdahl.worker.sync import ParamServerSync, make_strategy

pytestmark = pytest.mark.integration

WORLD = 2
STEPS = 15
BATCH = 16


@pytest.fixture
def ray_address(ray_cluster: Any) -> str:
    """The session's local Ray (tests/integration/conftest.py), for the workers to join."""
    return ray_cluster.get_runtime_context().gcs_address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.randn(8, 2, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(BATCH, 8, generator=torch.Generator().manual_seed(seed))
    return x, (x @ teacher).argmax(dim=1)


def _train(
    rank: int, name: str, steps: int, init_scale: float | None = None, accumulate_steps: int = 1
) -> dict[str, Any]:
    """The harness's contract: prepare, micro-steps, step, zero_grad, after_step, close."""
    torch.manual_seed(0)
    options = {"ps_shards": 2, "bucket_cap_mb": 25.0}
    strategy = make_strategy(name, options, torch.device("cpu"), accumulate_steps)
    model, optimizer = strategy.prepare(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
        lambda params: torch.optim.AdamW(params, lr=0.05),
    )
    pushes: list[float | None] = []
    if isinstance(strategy, ParamServerSync):  # count the pushes the strategy's step makes
        push_pull = strategy.server.push_pull

        def counted(lr: float | None, **kwargs: Any) -> None:
            pushes.append(lr)
            push_pull(lr, **kwargs)

        strategy.server.push_pull = counted
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale) if init_scale else None
    initial = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    x_val, y_val = _batch(seed=999)
    with torch.no_grad():
        before = float(F.cross_entropy(model(x_val), y_val))
    for step in range(steps):
        x, y = _batch(seed=100 * step + rank)
        n = strategy.micro_steps
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n), strict=True)):
            with strategy.micro_context(model, i):
                with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
                    loss = F.cross_entropy(model(xm), ym) / n
                (scaler.scale(loss) if scaler else loss).backward()
        strategy.step(optimizer, scaler)
        optimizer.zero_grad(set_to_none=True)
        strategy.after_step(model, step)
    with torch.no_grad():
        after = float(F.cross_entropy(model(x_val), y_val))
    # hold the server handles past close(): only an explicit kill ends them then (Ray would
    # also end them once every handle is gone)
    servers = list(strategy.server.actors) if isinstance(strategy, ParamServerSync) else []
    strategy.close()
    left_alive = _named_servers_after_kill() if rank == 0 and servers else []
    del servers
    return {
        "before": before,
        "after": after,
        "initial": initial,
        "final": nn.utils.parameters_to_vector(model.parameters()).detach().clone(),
        "scale": scaler.get_scale() if scaler else None,
        "left_alive": left_alive,
        "pushes": len(pushes),
    }


def _named_servers_after_kill(wait_s: float = 10.0) -> list[str]:
    """Named actors left in the servers' namespace, once kills have had time to land."""
    import ray

    from amdahl.worker.param_server import _PS_NAMESPACE

    deadline = time.monotonic() + wait_s
    while True:
        named = ray.util.list_named_actors(all_namespaces=True)
        alive = [a["name"] for a in named if a["namespace"] == _PS_NAMESPACE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _worker(rank: int, address: str, port: int, out_dir: Path) -> None:
    import ray

    torch.set_num_threads(1)
    ray.init(address=address, log_to_driver=False)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        out = {
            "ddp": _train(rank, "ddp", STEPS),
            "param_server": _train(rank, "param_server", STEPS),
            "accumulated": _train(rank, "param_server", STEPS, accumulate_steps=4),
            "overflow": _train(rank, "param_server", 1, init_scale=2.0**40),
        }
        torch.save(out, out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def test_param_server_matches_ddp_and_cleans_up(ray_address: str, tmp_path: Path) -> None:
    mp.spawn(_worker, args=(ray_address, _free_port(), tmp_path), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for r in range(WORLD):
        ps, ddp = ranks[r]["param_server"], ranks[r]["ddp"]
        assert ps["after"] < 0.8 * ps["before"], f"rank {r}: loss did not go down: {ps}"
        # same optimizer on the same averaged gradients: the same parameters as DDP
        torch.testing.assert_close(ps["final"], ddp["final"], rtol=1e-4, atol=1e-5)
        # accumulating 4 micro-batches: one push per optimizer step, of their summed gradients
        accumulated = ranks[r]["accumulated"]
        assert (ps["pushes"], accumulated["pushes"]) == (STEPS, STEPS)
        torch.testing.assert_close(accumulated["final"], ddp["final"], rtol=1e-4, atol=1e-5)
        # an fp16 step that overflowed is skipped on the servers for everyone
        overflow = ranks[r]["overflow"]
        torch.testing.assert_close(overflow["final"], overflow["initial"], rtol=0, atol=0)
        assert overflow["scale"] == 2.0**39
        # close() killed the per-trial actors
        assert ranks[r]["param_server"]["left_alive"] == []
    torch.testing.assert_close(
        ranks[0]["param_server"]["final"], ranks[1]["param_server"]["final"], rtol=0, atol=0
    )
