"""The memory probe and the model over it, against trials measured at batches it never ran."""

import pytest
import torch
from encoder_workload import TinyEncoder
from trial_runner import launch_config, one_rank_group, run, trial_config

from amdahl.analysis.memory_model import MemoryFacts, predict_peak
from amdahl.worker import memory_probe
from amdahl.worker.memory_probe import PROBE_BATCHES, probe_memory


@pytest.mark.parametrize("sync", ["none", "ddp"])
def test_the_prediction_holds_at_batches_the_probe_never_ran(tmp_path, sync):
    one_rank_group("gloo")
    workload = TinyEncoder()
    facts = MemoryFacts.from_dict(probe_memory(workload, "fp32", "sgd", 0, tmp_path))
    for batch in (64, 128):
        assert batch not in PROBE_BATCHES
        settings = dict(batch_size=batch, per_device_batch=batch, sync=sync)
        launch = launch_config((trial_config(**settings),), warmup_steps=3)
        stats, error, _ = run(workload, torch.device("cpu"), launch, **settings)
        assert error is None, error
        predicted = predict_peak(facts, sync, 1, batch).total
        assert predicted == pytest.approx(stats["peak_mem_bytes"], rel=0.10), batch


def test_a_second_probe_reads_its_cache_and_other_settings_probe_again(tmp_path, monkeypatch):
    workload = TinyEncoder()
    first = probe_memory(workload, "fp32", "sgd", 0, tmp_path)

    def measured_again(*args):
        raise AssertionError("measured again")

    monkeypatch.setattr(memory_probe, "_measure", measured_again)
    assert probe_memory(workload, "fp32", "sgd", 0, tmp_path) == first
    with pytest.raises(AssertionError, match="measured again"):
        probe_memory(workload, "bf16", "sgd", 0, tmp_path)
    with pytest.raises(AssertionError, match="measured again"):
        probe_memory(TinyEncoder(train_rows=256), "fp32", "sgd", 0, tmp_path)


def test_the_probe_counts_what_the_optimizer_keeps(tmp_path):
    sgd = probe_memory(TinyEncoder(), "fp32", "sgd", 0, tmp_path)
    adamw = probe_memory(TinyEncoder(), "fp32", "adamw", 0, tmp_path)
    assert sgd["optimizer_bytes"] == sgd["param_bytes"]  # momentum
    assert adamw["optimizer_bytes"] >= 2 * adamw["param_bytes"]  # two moments (and steps)


def test_a_model_too_large_for_the_drivers_cpu_is_not_built(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_probe, "PROBE_MAX_PARAM_BYTES", 1000)
    with pytest.raises(memory_probe.ProbeSkipped, match="too large to probe"):
        probe_memory(TinyEncoder(), "fp32", "sgd", 0, tmp_path)
