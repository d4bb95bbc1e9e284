"""FLOPs per sample counted, not stated (worker/flops.py): checked against torch's
FlopCounterMode run here directly on plain models the tests build themselves, and followed into
the results row (flops_per_sample, flops_source, mfu)."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from trial_runner import PARAMS, launch_config, run, trial_config

from amdahl.errors import UserError
from amdahl.worker import flops
from amdahl.worker.flops import Counted, count_training_flops, counted_flops, flops_figures
from amdahl.worker.rows import aggregate_ranks
from amdahl.workload.data_checks import check_workload
from workloads.gpt import GPT
from workloads.mlp import MLP


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """Every test counts afresh (the cache lives as long as the worker process)."""
    monkeypatch.setattr(flops, "_CACHE", {})


def _reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss) -> float:
    """torch's FlopCounterMode over one forward, loss and backward, per row."""
    with FlopCounterMode(display=False) as counter:
        loss(model(x), y).backward()
    return counter.get_total_flops() / len(x)


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _kaplan(gpt: GPT) -> float:
    """What the GPT workload stated before its FLOPs were counted: Kaplan's 6 x parameters
    (embeddings included) + 12 x layers x width x context, per token, times context tokens."""
    p = gpt.params
    w, n, t, v = p["width"], p["layers"], p["context"], p["vocab"]
    return (6.0 * (n * 12 * w * w + v * w + t * w) + 12.0 * n * w * t) * t


def test_the_d2l_mlp_counts_what_torch_executes_not_six_times_its_macs():
    torch.manual_seed(0)
    x, y = torch.randn(16, 512), torch.randint(0, 2, (16,))
    reference = _reference(_mlp([512, 256, 128, 2]), x, y, nn.functional.cross_entropy)
    # 6 x 164,096 MACs = 984,576, less the first layer's input gradient (2 x 512 x 256), which
    # autograd never computes: the inputs need no gradient.
    assert reference == 722_432
    counted = count_training_flops(MLP(), {"x": x, "y": y})
    assert counted.model == counted.hardware == reference  # nothing recomputed
    assert MLP().flops_per_sample() == reference  # the workload's analytic figure agrees


def test_attention_is_counted_on_cpu_as_torch_counts_its_fused_kernels():
    gpt = GPT(vocab=64, width=32, layers=2, heads=4, context=16)
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (4, 17))
    x, y = gpt.split_batch({"tokens": tokens})
    with sdpa_kernel(SDPBackend.MATH):  # attention as plain bmm, which torch's counter knows
        unfused = _reference(gpt.build_model(), x, y, gpt.loss)
    # The fused kernels' backward recomputes the scores: one more q @ k^T per layer, as torch's
    # formula for the CUDA kernels counts it (2 FLOPs x context x context x width per sample).
    # That is hardware FLOPs (HFU); the model's FLOPs (MFU, PaLM appendix B) are the unfused
    # path's, which saves the scores instead.
    recomputed = gpt.params["layers"] * 2 * 16 * 16 * 32
    counted = count_training_flops(gpt, {"tokens": tokens})
    assert counted.model == unfused
    assert counted.hardware == unfused + recomputed


@pytest.mark.parametrize(
    "params",
    [
        {"vocab": 64, "width": 32, "layers": 2, "heads": 4, "context": 16},
        {"vocab": 128, "width": 64, "layers": 3, "heads": 8, "context": 32},
    ],
)
def test_gpt_model_flops_equal_palms_analytic_formula(params):
    """Independent of the counter: 6 per token and weight of the linear maps and the head, plus
    PaLM's 12 x layers x width x context per token for attention (appendix B)."""
    gpt = GPT(**params)
    tokens = torch.from_numpy(gpt.generate("train", 4, seed=0)["tokens"])
    w, n, t, v = params["width"], params["layers"], params["context"], params["vocab"]
    palm = 6.0 * (n * 12 * w * w + v * w) * t + 12.0 * n * w * t * t
    assert count_training_flops(gpt, {"tokens": tokens}).model == pytest.approx(palm, rel=1e-9)
    assert gpt.flops_per_sample() == palm


def test_gpt_counted_differs_from_the_old_hand_formula():
    gpt = GPT()
    tokens = torch.from_numpy(gpt.generate("train", 4, seed=0)["tokens"])
    counted = count_training_flops(gpt, {"tokens": tokens}).model
    # Kaplan's formula counts the embeddings as matmuls (they are lookups); within the
    # report's 10%, but not the figure.
    assert counted != _kaplan(gpt)
    assert counted == pytest.approx(_kaplan(gpt), rel=0.10)


def test_counted_once_per_model_and_without_touching_torchs_random_state():
    x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
    mlp = MLP(**PARAMS)
    state = torch.get_rng_state()
    first, seconds = counted_flops(mlp, lambda: {"x": x, "y": y})
    assert torch.equal(torch.get_rng_state(), state)
    assert first.model == _reference(_mlp([64, 64, 4]), x, y, nn.functional.cross_entropy)
    assert seconds > 0
    # The same model again (another trial of it): the cached figure, no batch asked for.
    assert counted_flops(MLP(**PARAMS), lambda: pytest.fail("counted again")) == (first, 0.0)
    wider, seconds = counted_flops(MLP(**{**PARAMS, "hidden": [128]}), lambda: {"x": x, "y": y})
    assert wider.model > first.model and seconds > 0


class _BrokenLoss(MLP):
    def loss(self, output, target):
        raise RuntimeError("no loss here")


def test_a_failed_count_leaves_the_stated_figure(capsys):
    x, y = torch.randn(8, 64), torch.randint(0, 4, (8,))
    counted, _ = counted_flops(_BrokenLoss(**PARAMS), lambda: {"x": x, "y": y})
    assert counted is None
    assert "no loss here" in capsys.readouterr().err
    no_batch = {**PARAMS, "hidden": [32]}
    assert counted_flops(MLP(**no_batch), lambda: next(iter([])))[0] is None  # input ran dry
    assert "StopIteration" in capsys.readouterr().err
    assert flops_figures(counted, 5.0, override=False)["flops_source"] == "stated"


COUNTED = Counted(model=100.0, hardware=110.0)


@pytest.mark.parametrize(
    "counted, stated, override, used, source",
    [
        (COUNTED, 140.0, False, 100.0, "counted"),  # the count (the model's FLOPs) wins
        (COUNTED, 140.0, True, 140.0, "stated"),  # unless the workload overrides it
        (COUNTED, None, True, 100.0, "counted"),  # an override with nothing stated
        (None, 140.0, False, 140.0, "stated"),  # nothing counted
        (None, None, False, None, None),
    ],
)
def test_which_figure_mfu_uses(counted, stated, override, used, source):
    figures = flops_figures(counted, stated, override)
    assert (figures["flops_per_sample"], figures["flops_source"]) == (used, source)
    model = counted.model if counted else None
    hardware = counted.hardware if counted else None
    assert (figures["flops_counted"], figures["flops_hardware"]) == (model, hardware)
    assert figures["flops_stated"] == stated


class _Override(MLP):
    flops_override = True

    def flops_per_sample(self):
        return None


def test_an_override_without_a_stated_figure_is_refused_at_plan_time():
    with pytest.raises(UserError, match=r"flops_override = True but _Override.flops_per_sample"):
        check_workload(_Override(**PARAMS))


class _Watched(MLP):
    """Logs every forward of the models it builds: the first is the trial's, any later one the
    counting's, which also sleeps COUNT_S."""

    COUNT_S = 0.2

    def __init__(self, **params):
        super().__init__(**params)
        self.forwards: list[str] = []
        self.built = 0

    def build_model(self) -> nn.Module:
        model = super().build_model()
        which = "count" if self.built else "trial"
        self.built += 1

        def hook(*_):
            self.forwards.append(which)
            if which == "count":
                time.sleep(self.COUNT_S)

        model.register_forward_hook(hook)
        return model


def test_a_trial_counts_after_every_forward_of_its_own_and_times_the_count_apart():
    workload = _Watched(**PARAMS)
    stats, error, _ = run(workload, torch.device("cpu"))
    assert error is None, error
    # The warmup, the measured steps and the validation pass all ran before the count's one
    # forward: nothing of the count is inside a timed phase.
    trial_forwards = workload.forwards.index("count")
    assert trial_forwards > stats["measured_steps"] and workload.forwards[trial_forwards:] == [
        "count"
    ]
    assert stats["flops_count_s"] >= _Watched.COUNT_S
    assert stats["flops_counted"].model == 6 * (64 * 64 + 64 * 4) - 2 * 64 * 64


def test_the_row_and_its_mfu_use_the_counted_figure():
    stats, error, _ = run(MLP(**PARAMS), torch.device("cpu"))
    assert error is None, error
    torch.manual_seed(0)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    counted = _reference(_mlp([64, 64, 4]), x, y, nn.functional.cross_entropy)
    old = 6.0 * (64 * 64 + 64 * 4)  # what the MLP stated before: 6 x MACs
    row = aggregate_ranks([stats], trial_config(flops_per_sample=old), launch_config())
    assert (row["flops_per_sample"], row["flops_source"]) == (counted, "counted")
    assert (row["flops_counted"], row["flops_stated"]) == (counted, old)
    assert row["mfu"] == pytest.approx(row["throughput"] * counted / row["peak_flops"])
    assert row["achieved_flops"] == pytest.approx(row["throughput"] * counted)
    override = trial_config(flops_per_sample=old, flops_override=True)
    row = aggregate_ranks([stats], override, launch_config())
    assert (row["flops_per_sample"], row["flops_source"]) == (old, "stated")
    assert row["mfu"] == pytest.approx(row["throughput"] * old / row["peak_flops"])
