"""The shipped workloads build, state the FLOPs torch counts, and learn from their own data."""

import pytest
import torch

from amdahl.workload.code import REGISTERED, make_workload


@pytest.mark.parametrize(
    "name, params",
    [
        ("mlp", {"inputs": 32, "hidden": [32], "train_rows": 512}),
        ("gpt", {"vocab": 32, "width": 32, "layers": 1, "heads": 2, "context": 16}),
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
