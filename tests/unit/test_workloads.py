"""The shipped workloads build, state the FLOPs torch counts, and learn from their own data."""

import os
from unittest import mock

import pytest
import torch

from amdahl.errors import UserError
from amdahl.workload.code import REGISTERED, make_workload


@pytest.mark.parametrize(
    "name, params",
    [
        ("mlp", {"inputs": 32, "hidden": [32], "train_rows": 512}),
        ("gpt", {"vocab": 32, "width": 32, "layers": 1, "heads": 2, "context": 16}),
        ("simulated", {"forward_fixed_ms": 0.0, "forward_per_sample_us": 0.001}),
    ],
)
def test_workload_learns_from_its_data(name, params):
    workload = make_workload(name, params)
    torch.manual_seed(0)
    model = workload.build_model()
    data = {k: torch.from_numpy(v) for k, v in workload.generate("train", 512, seed=0).items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(60):
        sel = slice((step % 8) * 64, (step % 8 + 1) * 64)
        x, y = workload.split_batch({k: v[sel] for k, v in data.items()})
        loss = workload.loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert workload.flops_per_sample() > 0
    correct = workload.correct(model(x), y)
    assert 0 <= float(correct) <= len(y)


@pytest.mark.parametrize(
    "name, params",
    [
        ("mlp", {}),  # the D2L MLP
        ("mlp", {"inputs": 32, "hidden": [16, 8, 4], "classes": 3}),
        ("gpt", {}),
        ("gpt", {"vocab": 100, "width": 48, "layers": 4, "heads": 3, "context": 8}),
        ("resnet", {"width": 4, "classes": 5, "augment": "none"}),
    ],
)
def test_stated_flops_are_what_torchs_counter_counts(name, params):
    """Each shipped workload's stated figure is an exact cross-check of the model FLOPs MFU
    uses (worker/flops.py; the counter itself is checked against plain torch in
    tests/unit/worker/test_flops_count.py, and GPT's against PaLM's formula), at its defaults
    and away from them."""
    from amdahl.worker.flops import count_training_flops

    workload = make_workload(name, params)
    rows = workload.generate("train", 4, seed=0)
    rows = workload.preprocess(rows, training=True) if workload.preprocesses else rows
    batch = {k: torch.as_tensor(v) for k, v in rows.items()}
    assert workload.flops_per_sample() == count_training_flops(workload, batch).model


def test_every_registered_workload_resolves():
    for name in REGISTERED:
        assert make_workload(name, {}).defaults


def test_every_registered_workload_passes_the_plan_time_checks():
    from amdahl.workload.data_checks import check_workload

    small = {"mlp": {"inputs": 8, "hidden": [8]}, "gpt": {"vocab": 32, "width": 16, "context": 8}}
    for name in REGISTERED:
        check_workload(make_workload(name, small.get(name, {})))


def test_workload_is_an_abstract_base():
    import pytest

    from amdahl.errors import UserError
    from amdahl.workload.api import REQUIRED, Workload

    assert Workload.__abstractmethods__ == frozenset(REQUIRED)
    with pytest.raises(TypeError):
        Workload()

    class NoLoss(Workload):
        def build_model(self):
            return torch.nn.Linear(1, 1)

        def generate(self, split, num_rows, seed):
            return {}

        def split_batch(self, batch):
            return batch, batch

    with pytest.raises(TypeError, match="loss"):
        NoLoss()
    import sys

    sys.modules[__name__].NoLoss = NoLoss  # resolvable by name, as a sweep file names it
    try:
        with pytest.raises(UserError, match=r"NoLoss .* does not implement loss"):
            make_workload(f"{__name__}:NoLoss", {})
    finally:
        del sys.modules[__name__].NoLoss


def test_the_simulated_accelerator_states_its_times_and_moves_real_gradients():
    from workloads.simulated import SimulatedTiming

    workload = make_workload(
        "simulated", {"layers": 3, "params_per_layer": 1000, "forward_fixed_ms": 0.0}
    )
    params = workload.params
    timing = SimulatedTiming({**params, "forward_fixed_ms": 2.0, "forward_per_sample_us": 10.0})
    x, w = torch.zeros(50, 16), torch.zeros(1000)
    assert timing.seconds(x, w) == pytest.approx((0.0025, 0.005))  # 2 ms + 50 x 10 us; x2 back
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert timing.seconds(x, w)[0] == pytest.approx(0.0025 * params["bf16_factor"])
    slow = SimulatedTiming({**params, "straggler_rank": 0, "straggler_factor": 3.0})
    assert slow.seconds(x, w)[0] == pytest.approx(3 * params["forward_per_sample_us"] * 50e-6)
    jittery = SimulatedTiming({**params, "jitter": 0.2})
    spread = [
        jittery.seconds(x, w)[0] / (params["forward_per_sample_us"] * 50e-6) for _ in range(50)
    ]
    assert 0.8 <= min(spread) < max(spread) <= 1.2

    model = workload.build_model()
    batch = {k: torch.from_numpy(v) for k, v in workload.generate("train", 64, seed=0).items()}
    inputs, target = workload.split_batch(batch)
    workload.loss(model(inputs), target).backward()
    grads = [p.grad for p in model.parameters()]
    assert sum(g.numel() for g in grads) == 3 * 1000 + 16 * 4 + 4  # every byte a DDP would move
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)

    # MFU's figures: the stated peak per precision, and the FLOPs it would run in the sleeps
    assert workload.peak_flops("bf16") == 2 * workload.peak_flops("fp32") == 2e14
    per_sample_s = 3 * params["forward_per_sample_us"] * 1e-6 * (1 + params["backward_factor"])
    assert workload.flops_per_sample() == pytest.approx(1e14 * per_sample_s)


def test_the_simulated_accelerators_jitter_straggler_and_in_core_slowdown():
    """What separates a user's fit sweep from the one they measure (scale_check.py's held-out
    sets): a per-pass lognormal jitter shared by every layer of a pass and reproducible from its
    seed, a straggler slow only every k-th pass, and compute slowed by 1 + c(ranks per node - 1)."""
    from workloads.simulated import SimulatedTiming

    params = make_workload("simulated", {"forward_fixed_ms": 0.0}).params
    x, w = torch.zeros(50, 16), torch.zeros(4)
    base = params["forward_per_sample_us"] * 50e-6

    def passes(timing: SimulatedTiming, n: int, layers: int = 2) -> list[list[float]]:
        out = []
        for _ in range(n):
            timing.next_pass()
            out.append([timing.seconds(x, w)[0] / base for _ in range(layers)])
        return out

    jittery = passes(SimulatedTiming({**params, "jitter_sigma": 0.2, "jitter_seed": 1}), 200)
    assert all(a == b for a, b in jittery)  # one draw per pass, every layer of it alike
    factors = sorted(a for a, _ in jittery)
    assert factors[0] < 0.8 and factors[-1] > 1.25 and 0.9 < factors[100] < 1.1
    again = passes(SimulatedTiming({**params, "jitter_sigma": 0.2, "jitter_seed": 1}), 200)
    other = passes(SimulatedTiming({**params, "jitter_sigma": 0.2, "jitter_seed": 2}), 200)
    assert again == jittery != other

    every = {"straggler_rank": 0, "straggler_factor": 3.0, "straggler_every": 4}
    stalls = [a for a, _ in passes(SimulatedTiming({**params, **every}), 8)]
    assert stalls == pytest.approx([1, 1, 1, 3, 1, 1, 1, 3])

    crowded = SimulatedTiming({**params, "in_core_slowdown": 0.1})
    assert crowded.seconds(x, w)[0] == pytest.approx(base)  # alone on its node
    # a launch of 8 workers on one node: its 1-device trial is alone on the node's bandwidth
    with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}):
        assert crowded.seconds(x, w)[0] == pytest.approx(base)
        with mock.patch("workloads.simulated.dist.is_initialized", return_value=True):
            with mock.patch("workloads.simulated.dist.get_world_size", return_value=8):
                with mock.patch("workloads.simulated.dist.get_rank", return_value=3):
                    assert crowded.seconds(x, w)[0] == pytest.approx(base * 1.7)
    # the same 8 ranks over 2 nodes of 4 (a launch of 16, 8 per node): 4 per node
    with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16"}):
        with mock.patch("workloads.simulated.dist.is_initialized", return_value=True):
            with mock.patch("workloads.simulated.dist.get_world_size", return_value=8):
                with mock.patch("workloads.simulated.dist.get_rank", return_value=3):
                    assert crowded.seconds(x, w)[0] == pytest.approx(base * 1.3)
    with pytest.raises(UserError, match=r"params.straggler_every: must be an integer >= 1"):
        make_workload("simulated", {"straggler_every": 0})


def test_the_simulated_accelerators_times_must_be_positive():
    from amdahl.errors import UserError

    with pytest.raises(UserError, match=r"params.bf16_factor: must be > 0, got 0"):
        make_workload("simulated", {"bf16_factor": 0})
    with pytest.raises(UserError, match=r"params.jitter: must be >= 0"):
        make_workload("simulated", {"jitter": -0.1})
