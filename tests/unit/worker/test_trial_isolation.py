"""A trial's outcome does not depend on the trials that ran before it in the same process (a
worker group runs many): precision x compile, run in one order and in the reverse order."""

import torch
from trial_runner import PARAMS, run

from workloads.mlp import MLP

COMBINATIONS = [
    (precision, compile_)
    for precision in ("fp32", "bf16", "fp16", "bf16_weights")
    for compile_ in ("eager", "torchscript")
] + [("fp32", "inductor"), ("bf16", "inductor")]


def _outcomes(order):
    out = {}
    for precision, compile_ in order:
        stats, error, kind = run(
            MLP(**PARAMS), torch.device("cpu"), precision=precision, compile=compile_
        )
        out[precision, compile_] = (kind, error, stats.get("final_loss"), stats.get("val_loss"))
    return out


def test_every_trial_computes_the_same_whatever_ran_before_it():
    forward = _outcomes(COMBINATIONS)
    backward = _outcomes(list(reversed(COMBINATIONS)))
    # Before the per-trial reset of TorchScript's compiled types, fp16 x torchscript after
    # bf16 x torchscript failed ("expected mat1 and mat2 to have the same dtype").
    assert all(kind is None for kind, *_ in forward.values()), forward
    assert forward == backward


def test_tf32_flags_are_the_trials_own_and_restored():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    stats, error, _ = run(MLP(**PARAMS), torch.device("cpu"), precision="tf32")
    assert error is None
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
