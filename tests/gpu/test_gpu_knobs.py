"""The knobs of issue 48 on a GPU, through the harness: activation checkpointing lowers CUDA's
allocated peak and raises the counted hardware FLOPs under bf16 autocast and NCCL, accumulation
runs its micro-batches under no_sync / set_requires_gradient_sync, and the memory model's
prediction (the probe measured on CPU) stays near CUDA's peak for each mode."""

import pytest
from trial_runner import launch_config, run

from amdahl.analysis.memory_model import MemoryFacts, predict_peak
from amdahl.worker.memory_probe import probe_memory
from workloads.gpt import GPT

PARAMS = {"width": 256, "layers": 4, "heads": 4, "context": 128, "train_rows": 2048}


def _trial(cuda, **settings):
    stats, error, _ = run(
        GPT(**PARAMS),
        cuda,
        launch_config(warmup_steps=3),
        params=PARAMS,
        batch_size=32,
        per_device_batch=32,
        **settings,
    )
    assert error is None, error
    return stats


@pytest.mark.parametrize("sync", ["ddp", "fsdp"])
def test_checkpointing_trades_cuda_memory_for_hardware_flops(cuda, sync):
    plain = _trial(cuda, sync=sync, precision="bf16")
    full = _trial(cuda, sync=sync, precision="bf16", activation_checkpointing="full")
    assert full["peak_mem_bytes"] < plain["peak_mem_bytes"]
    assert full["flops_counted"].hardware > plain["flops_counted"].hardware
    assert full["flops_counted"].model == plain["flops_counted"].model


@pytest.mark.parametrize("sync", ["ddp", "zero1", "fsdp"])
def test_accumulation_runs_its_micro_batches_on_nccl(cuda, sync):
    stats = _trial(cuda, sync=sync, accumulate_steps=2)
    assert stats["micro_steps"] == 2


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_the_memory_model_predicts_cudas_peak_for_each_mode(cuda, mode, tmp_path):
    facts = MemoryFacts.from_dict(probe_memory(GPT(**PARAMS), "fp32", "sgd", 0, tmp_path))
    measured = _trial(cuda, sync="none", activation_checkpointing=mode)["peak_mem_bytes"]
    predicted = predict_peak(facts, "none", 1, 32, checkpointing=mode).total
    # the CPU-measured line against CUDA's allocator (cuBLAS workspaces, 512-byte rounding)
    assert 0.8 * measured <= predicted <= 1.25 * measured, (predicted, measured)
