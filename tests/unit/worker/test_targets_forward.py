"""A model as users bring it: one whose forward takes its targets and returns (logits, loss), as
nanoGPT's does, and one whose inputs are a dict, run through `Workload.forward` by the timed
loop, validation, the FLOP count and the memory probe, in every precision."""

import numpy as np
import pytest
import torch
from torch import nn
from trial_runner import launch_config, run, trial_config

from amdahl import Workload
from amdahl.worker.memory_probe import probe_memory

VOCAB, CONTEXT = 32, 8


class _TargetsLM(nn.Module):
    """nanoGPT's contract: forward(idx, targets=None) -> (logits, loss or None); called as
    model(idx) it takes its inference path and returns no loss."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)

    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx))
        if targets is None:
            return logits[:, -1:, :], None
        return logits, nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


class TargetsLM(Workload):
    defaults = {"train_rows": 256, "val_rows": 64}

    def build_model(self):
        return _TargetsLM()

    def generate(self, split, num_rows, seed):
        rng = np.random.default_rng([seed, split == "val"])
        tokens = rng.integers(0, VOCAB, (num_rows, CONTEXT + 1), dtype=np.int64)
        return {"tokens": tokens}

    def split_batch(self, batch):
        return batch["tokens"][:, :-1], batch["tokens"][:, 1:]

    def forward(self, model, inputs, targets):
        return model(inputs, targets)

    def loss(self, output, target):
        raise AssertionError("the model computes its own loss")

    def correct(self, output, target):
        return (output.argmax(-1) == target).float().mean(dim=1).sum()


class _DictModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(3, 2)

    def forward(self, x, extra):
        return self.a(x) + self.b(extra)


class DictInputs(Workload):
    defaults = {"train_rows": 256, "val_rows": 64}

    def build_model(self):
        return _DictModel()

    def generate(self, split, num_rows, seed):
        rng = np.random.default_rng([seed, split == "val"])
        x = rng.standard_normal((num_rows, 4), dtype=np.float32)
        extra = rng.standard_normal((num_rows, 3), dtype=np.float32)
        return {"x": x, "extra": extra, "y": (x[:, 0] > 0).astype(np.int64)}

    def split_batch(self, batch):
        return {"x": batch["x"], "extra": batch["extra"]}, batch["y"]

    def forward(self, model, inputs, targets):
        output = model(**inputs)
        return output, self.loss(output, targets)

    def loss(self, output, target):
        return nn.functional.cross_entropy(output, target)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16_weights", "fp16"])
@pytest.mark.parametrize("workload", [TargetsLM, DictInputs])
def test_a_model_that_takes_its_targets_or_a_dict_trains_in_every_precision(workload, precision):
    settings = dict(batch_size=16, per_device_batch=16, precision=precision)
    launch = launch_config((trial_config(**settings),), steps=30, warmup_steps=3)
    stats, error, _ = run(workload(), torch.device("cpu"), launch, **settings)
    assert error is None, error
    losses = [v for v in stats["history"]["loss"] if v is not None]
    assert len(losses) == 33 and np.isfinite(stats["val_loss"])
    assert stats["flops_counted"].model > 0  # the count ran through Workload.forward
    assert stats["peak_mem_bytes"] > 0


def test_the_memory_probe_runs_a_targets_taking_model(tmp_path):
    facts = probe_memory(TargetsLM(), "fp32", "sgd", 0, tmp_path)
    assert facts["param_bytes"] == sum(p.numel() * 4 for p in _TargetsLM().parameters())
    assert facts["step_per_sample"] > 0
