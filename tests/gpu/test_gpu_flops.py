"""FLOPs per sample counted on the GPU (worker/flops.py): the same figure as on CPU, where
attention runs torch's CUDA kernels (counted by torch's own formulas) instead of the CPU kernel
flops.py gives those formulas to; and a GPU trial counts on the batch its feed holds ahead."""

import pytest
import torch
from trial_runner import PARAMS, run

from amdahl.worker import flops
from amdahl.worker.flops import count_training_flops
from workloads.gpt import GPT
from workloads.mlp import MLP


@pytest.mark.parametrize("workload", [MLP(), GPT()], ids=["mlp", "gpt"])
def test_the_count_on_the_gpu_is_the_count_on_cpu(cuda, workload):
    rows = workload.generate("train", 8, seed=0)
    batch = {k: torch.as_tensor(v) for k, v in rows.items()}
    on_cpu = count_training_flops(workload, batch)
    on_gpu = count_training_flops(workload, {k: v.to(cuda) for k, v in batch.items()})
    assert on_gpu == on_cpu  # model and hardware FLOPs alike
    assert on_gpu.model == workload.flops_per_sample()
    # the fused attention backward recomputes its scores: hardware FLOPs only (MFU leaves them out)
    recomputes = isinstance(workload, GPT)
    assert (on_gpu.hardware > on_gpu.model) == recomputes, on_gpu


def test_a_gpu_trial_counts_its_flops_after_the_window(cuda, monkeypatch):
    monkeypatch.setattr(flops, "_CACHE", {})
    stats, error, _ = run(MLP(**PARAMS), cuda)
    assert error is None, error
    assert stats["flops_counted"].model == MLP(**PARAMS).flops_per_sample()
    assert stats["flops_count_s"] > 0
