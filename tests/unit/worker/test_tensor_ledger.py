"""A trial's `peak_mem_bytes` on CPU is tensor bytes, as a device would hold them: checked
against torch's own MemTracker measuring the same step of a plain training loop (the same model,
batch, optimizer and precision), and its breakdown against the tensors it names."""

import pytest
import torch
from encoder_workload import TinyEncoder
from memtracker_reference import memtracker_peak
from torch import nn
from trial_runner import launch_config, one_rank_group, run, trial_config

from amdahl import Workload
from amdahl.worker.tensor_ledger import BREAKDOWN_COLUMNS, TensorLedger, sync_buffer_bytes


def _trial(workload: Workload, warmup_steps: int = 3, **settings) -> dict:
    """One trial's stats in this process; three warmup steps: the ledger counts the last."""
    trial = trial_config(**settings)
    launch = launch_config((trial,), warmup_steps=warmup_steps)
    stats, error, _ = run(workload, torch.device("cpu"), launch, **settings)
    assert error is None, error
    return stats


@pytest.mark.parametrize(
    ("batch", "precision", "warmup"),
    [(8, "fp32", 3), (64, "fp32", 3), (32, "bf16", 3), (64, "fp32", 1)],
)
def test_cpu_peak_is_tensor_bytes_within_10_percent_of_memtracker(batch, precision, warmup):
    # warmup 1: too few warmup steps to count one, so one more step after the window counts
    workload = TinyEncoder()
    stats = _trial(workload, warmup, batch_size=batch, per_device_batch=batch, precision=precision)
    reference = memtracker_peak(workload, batch, precision)
    assert stats["peak_mem_bytes"] == pytest.approx(reference, rel=0.10)
    # the resident figure is its own column, and it is not the tensor bytes
    assert stats["peak_rss_bytes"] not in (None, stats["peak_mem_bytes"])


def test_breakdown_adds_up_and_names_the_tensors():
    workload = TinyEncoder()
    stats = _trial(workload, batch_size=64, per_device_batch=64)
    parts = {k: stats[k] for k in BREAKDOWN_COLUMNS}
    assert sum(parts.values()) == stats["peak_mem_bytes"]
    param_bytes = sum(p.numel() * 4 for p in workload.build_model().parameters())
    assert parts["mem_parameters_bytes"] == param_bytes
    assert parts["mem_optimizer_bytes"] == param_bytes  # SGD momentum: one buffer a parameter
    # a batch of 64 x 32 tokens: the saved activations outweigh the weights
    assert parts["mem_activations_bytes"] > param_bytes


@pytest.mark.parametrize("warmup", [3, 2])
def test_ddp_adds_its_gradient_buckets_to_the_plain_models_peak(warmup):
    # warmup 2: the second step rebuilds DDP's buckets, so a step after the window counts
    one_rank_group("gloo")
    workload = TinyEncoder()
    plain = _trial(workload, warmup, batch_size=16, per_device_batch=16)
    ddp = _trial(workload, warmup, batch_size=16, per_device_batch=16, sync="ddp")
    param_bytes = sum(p.numel() * 4 for p in workload.build_model().parameters())
    assert ddp["mem_other_bytes"] == param_bytes  # one flat fp32 copy of the gradients
    assert ddp["peak_mem_bytes"] == pytest.approx(plain["peak_mem_bytes"] + param_bytes, rel=0.02)


def test_ddp_bucket_bytes_are_what_ddp_allocates_when_built():
    one_rank_group("gloo")
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    ledger = TensorLedger()
    ledger.seed("parameters", list(model.parameters()))
    with ledger:
        ddp = nn.parallel.DistributedDataParallel(model)
    assert sync_buffer_bytes(ddp) == ledger.live["activations"] > 0
    assert sync_buffer_bytes(model) == 0


def test_an_inductor_trial_on_cpu_has_no_tensor_byte_peak_rather_than_a_low_one():
    stats = _trial(TinyEncoder(), compile="inductor")
    assert stats["peak_mem_bytes"] is None
    assert all(stats[k] is None for k in BREAKDOWN_COLUMNS)
    assert stats["peak_rss_bytes"] > 0


def test_ledger_follows_storage_resizes_and_frees():
    ledger = TensorLedger()
    with ledger:
        a = torch.ones(1024)  # 4 KiB, made under the mode
        a.untyped_storage().resize_(0)  # freed in place, as FSDP2 frees an unsharded parameter
        assert ledger.total == 0
        a.untyped_storage().resize_(8 * 1024)
        b = a * 2
        assert ledger.total == 8 * 1024 + 4 * 1024
        del b
        assert ledger.total == 8 * 1024
    assert ledger.peak == 12 * 1024
