"""The workload's own print in build_model reaches the terminal once per process, not once per
trial and per FLOP count (issue 53: 8-9 times into one sweep's terminal)."""

from __future__ import annotations

import torch
from torch import nn
from trial_runner import PARAMS, run

from workloads.mlp import MLP


class ChattyMLP(MLP):
    def build_model(self) -> nn.Module:
        print("ChattyMLP: parameters built (a message of its own)")
        return super().build_model()


def test_a_print_in_build_model_shows_once_across_trials(capsys):
    for _ in range(3):
        _, error, _ = run(ChattyMLP(**PARAMS), torch.device("cpu"))
        assert error is None
    out = capsys.readouterr().out
    assert out.count("ChattyMLP: parameters built") == 1, out


def test_different_text_is_printed():
    import contextlib
    import io

    from amdahl.worker.user_output import printed_once

    seen = io.StringIO()
    with contextlib.redirect_stdout(seen):
        for text in ("model of width 8", "model of width 16", "model of width 8"):
            with printed_once():
                print(text)
    assert seen.getvalue().splitlines() == ["model of width 8", "model of width 16"]
