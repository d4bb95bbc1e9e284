"""The parameter server's pure pieces (worker/param_server.py), without Ray or a process group:
how keys are spread over shards, and one shard's synchronous rounds. The strategy over real
actors is tests/integration/test_param_server.py."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from amdahl.worker.param_server import _ParamShard, assign_shards


def test_assign_shards_balances_by_size_and_is_deterministic() -> None:
    sizes = {"w1": 100, "w2": 90, "b1": 10, "b2": 5, "w3": 50}
    shards = assign_shards(sizes, 2)
    assert sorted(k for keys in shards for k in keys) == sorted(sizes)
    assert shards == [["w1", "b1", "b2"], ["w2", "w3"]]  # largest first onto the lighter shard
    assert assign_shards(dict(reversed(sizes.items())), 2) == shards
    assert len(assign_shards({"w": 4}, 3)) == 1  # no empty shards


def test_param_shard_averages_pushes_of_all_workers_then_updates() -> None:
    """The server round without Ray: two workers push gradients 2 and 6; SGD(lr=1) applies 4."""
    shard = _ParamShard({"w": np.zeros(2, np.float32)}, torch.optim.SGD, {"lr": 1.0}, world=2)

    async def round_(pushes: list[dict[str, np.ndarray] | None]) -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(shard.push_pull(p) for p in pushes))

    grads = [{"w": np.full(2, 2.0, np.float32)}, {"w": np.full(2, 6.0, np.float32)}]
    answers = asyncio.run(round_(grads))
    for answer in answers:
        np.testing.assert_array_equal(answer["w"], [-4.0, -4.0])
    # a skip mark (a worker's fp16 gradients overflowed) skips the update for everyone
    answers = asyncio.run(round_([grads[0], None]))
    for answer in answers:
        np.testing.assert_array_equal(answer["w"], [-4.0, -4.0])


def test_param_shard_applies_the_rate_the_workers_push() -> None:
    """The harness's LR schedule lives on the workers; each round carries it to the shards."""
    shard = _ParamShard({"w": np.zeros(1, np.float32)}, torch.optim.SGD, {"lr": 1.0}, world=2)
    grads = [{"w": np.full(1, 2.0, np.float32)}, {"w": np.full(1, 6.0, np.float32)}]

    async def round_(lr: float) -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(shard.push_pull(g, lr) for g in grads))

    np.testing.assert_allclose(asyncio.run(round_(0.25))[0]["w"], [-1.0])  # 0.25 x mean 4
    np.testing.assert_allclose(asyncio.run(round_(0.5))[0]["w"], [-3.0])
