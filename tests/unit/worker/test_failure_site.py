"""A failed trial's error names the place in the user's code (issue 53): the live table, the
report and `platform report` show the error's first line, so it carries the innermost frame
outside amdahl, torch and the Python installation; the traceback below starts there."""

from __future__ import annotations

import inspect

import torch
from torch import nn
from trial_runner import PARAMS, run

from workloads.mlp import MLP


class _WrongWidth(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(PARAMS["inputs"] + 1, 4)  # one input too many

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)  # the line the error must name


class WrongWidthMLP(MLP):
    def build_model(self) -> nn.Module:
        return _WrongWidth()


def test_the_error_names_the_users_file_and_line_on_its_first_line():
    _, error, kind = run(WrongWidthMLP(**PARAMS), torch.device("cpu"))
    assert kind == "failed"
    first, second, *rest = error.splitlines()
    line = inspect.getsourcelines(_WrongWidth.forward)[1] + 1
    assert first.startswith("failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert first.endswith(f"(at test_failure_site.py:{line} in forward)"), first
    assert second == f"{__file__}:{line}"  # the full path, for an editor
    # the traceback starts at the user's frame and goes on into torch
    assert "return self.layer(x)" in rest[1] and any("torch" in r for r in rest)


def test_a_failure_inside_libraries_only_has_no_site():
    from amdahl.worker.failure_site import failure_text, user_frame

    try:
        torch.zeros(2) @ torch.zeros(3)
    except RuntimeError as e:
        assert user_frame(e.__traceback__) is not None  # this test file is the user's code
    try:
        torch.nn.functional.linear(torch.zeros(2, 3), torch.zeros(4, 5))
    except RuntimeError as e:
        e.__traceback__ = e.__traceback__.tb_next  # drop this file's frame: only torch's left
        text = failure_text(e, "x")
        assert text.splitlines()[0] == "failed: RuntimeError: x"
