"""The `accumulate_steps` axis on two gloo ranks: each strategy that communicates per step does
it once per optimizer step, after the last micro-batch, counted in the profiler's record of
the collectives (not timed); and the update is the one of all the micro-batches in one pass.
Plain processes on gloo over loopback, no Ray."""

from __future__ import annotations

import collections
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import spawn_ranks
from torch import nn
from torch.profiler import ProfilerActivity, profile
from trial_runner import PARAMS, launch_config, run, trial_config

from amdahl.worker.rows import results_row
from amdahl.worker.sync import make_strategy, unwrap
from workloads.mlp import MLP

ACCUMULATE = 4
STEPS = 2
MICRO_BATCH = 4
STRATEGIES = ("zero1", "fsdp", "ddp", "powersgd")


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step's samples on `rank` (every micro-batch of it)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(ACCUMULATE * MICRO_BATCH, 8, generator=g)
    return x, torch.randint(0, 2, (len(x),), generator=g)


def _full_params(model: nn.Module) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    parts = [p.full_tensor() if isinstance(p, DTensor) else p for p in unwrap(model).parameters()]
    return torch.cat([p.detach().reshape(-1) for p in parts]).clone()


def _train(name: str, rank: int, accumulate_steps: int) -> tuple[dict[str, int], list, int]:
    """STEPS optimizer steps over the same samples, as the harness drives a strategy, split
    into its `micro_steps` micro-batches: (the reducing collectives run, final parameters,
    forward/backward passes)."""
    torch.manual_seed(0)
    options = {"bucket_cap_mb": 25.0, "powersgd_rank": 1}
    strategy = make_strategy(name, options, torch.device("cpu"), accumulate_steps)
    model, optimizer = strategy.prepare(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)),
        lambda params: torch.optim.SGD(params, lr=0.1),
    )
    passes = 0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(STEPS):
            x, y = _batch(rank, step)
            micro = zip(x.chunk(strategy.micro_steps), y.chunk(strategy.micro_steps), strict=True)
            for i, (xm, ym) in enumerate(micro):
                with strategy.micro_context(model, i):
                    (F.cross_entropy(model(xm), ym) / strategy.micro_steps).backward()
                passes += 1
            strategy.step(optimizer, None)
            optimizer.zero_grad(set_to_none=True)
    reductions = collections.Counter(
        e.name for e in prof.events() if e.name.startswith("c10d::") and "reduce" in e.name
    )
    params = _full_params(model).tolist()  # plain data: the queue outlives no tensor's memory
    strategy.close()
    return dict(reductions), params, passes


def _ranks(rank: int, world: int, port: int, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    got = {(name, a): _train(name, rank, a) for name in STRATEGIES for a in (1, ACCUMULATE)}
    out.put((rank, got))
    dist.barrier()
    dist.destroy_process_group()


def test_accumulation_communicates_once_per_optimizer_step_with_every_strategy():
    procs, out = spawn_ranks(_ranks, 2)
    ranks = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for name in STRATEGIES:
        one, _, one_passes = ranks[0][(name, 1)]
        accumulated, params, passes = ranks[0][(name, ACCUMULATE)]
        assert (one_passes, passes) == (STEPS, STEPS * ACCUMULATE), name
        # the same collectives per optimizer step, not per micro-batch (ACCUMULATE x as many)
        assert sum(one.values()) > 0, name
        assert accumulated == one, (name, accumulated, one)
        # the replicas agree after the last micro-batch's reduction
        other = ranks[1][(name, ACCUMULATE)][1]
        torch.testing.assert_close(torch.tensor(params), torch.tensor(other), rtol=0, atol=1e-6)
    for name in ("zero1", "fsdp", "ddp"):  # exact reductions: the one-pass update
        accumulated, one = ranks[0][(name, ACCUMULATE)][1], ranks[0][(name, 1)][1]
        torch.testing.assert_close(
            torch.tensor(accumulated), torch.tensor(one), rtol=1e-5, atol=1e-6
        )


def test_a_trial_runs_its_axis_value_of_micro_batches_and_its_row_counts_them():
    """Through the harness: the loop takes `accumulate_steps` batches per optimizer step, and
    the row's global batch (so its throughput) counts every one of them."""
    trial = trial_config(accumulate_steps=3)
    launch = launch_config((trial,))
    stats, error, _ = run(MLP(**PARAMS), torch.device("cpu"), launch, accumulate_steps=3)
    assert error is None, error
    ranks = [{"stats": stats, "error": None, "node": "n"}]
    row = results_row(launch, trial, 0, ranks, time.perf_counter(), "stamp", torch.device("cpu"))
    assert (row["accumulate_steps"], row["micro_steps"]) == (3, 3)
    assert row["global_batch"] == 3 * trial.per_device_batch
    assert row["throughput"] == pytest.approx(
        row["global_batch"] * stats["measured_steps"] / stats["window_s"]
    )
