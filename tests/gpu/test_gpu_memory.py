"""On a GPU, `peak_mem_bytes` is CUDA's allocated peak and the breakdown the tensor ledger's
(worker/tensor_ledger.py): the ledger must see what the allocator holds, less the allocator's
rounding and what lives outside tensors the step makes (cuBLAS's workspace)."""

import pytest
from encoder_workload import TinyEncoder
from trial_runner import launch_config, run, trial_config

from amdahl.worker.tensor_ledger import BREAKDOWN_COLUMNS


@pytest.mark.parametrize(
    ("precision", "sync"), [("fp32", "none"), ("bf16", "ddp"), ("fp32", "fsdp")]
)
def test_the_ledger_accounts_for_cudas_allocated_peak(cuda, precision, sync):
    settings = dict(batch_size=256, per_device_batch=256, precision=precision, sync=sync)
    trial = trial_config(**settings)
    stats, error, _ = run(TinyEncoder(), cuda, launch_config((trial,), warmup_steps=3), **settings)
    assert error is None, error
    ledger = sum(stats[k] for k in BREAKDOWN_COLUMNS)
    # the allocator rounds each block up to 512 bytes, and holds cuBLAS's workspace besides
    assert 0.7 * stats["peak_mem_bytes"] <= ledger <= 1.02 * stats["peak_mem_bytes"]
    assert stats["peak_rss_bytes"] is None
    assert stats["peak_mem_reserved_bytes"] >= stats["peak_mem_bytes"]


def test_an_inductor_trial_on_a_gpu_keeps_cudas_peak_without_a_breakdown(cuda):
    stats, error, _ = run(TinyEncoder(), cuda, compile="inductor")
    assert error is None, error
    assert stats["peak_mem_bytes"] > 0
    assert all(stats[k] is None for k in BREAKDOWN_COLUMNS)
