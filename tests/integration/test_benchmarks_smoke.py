"""The benchmarks still run against the package they import internals of: each module imports
without side effects, and those needing no Ray cluster of their own run their `--smoke` path
(one round at the smallest size). The rest start a local Ray each (minutes): imported only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: Seconds-long in --smoke, in a process of their own (torch and gloo; no Ray).
SMOKE_RUN = (
    "step_bookkeeping",
    "loop_overhead",
    "host_contention",
    "compile_per_config",
    "memory_check",
    "calibration_cost",
)


def _modules() -> list[str]:
    return sorted(p.stem for p in BENCHMARKS.glob("*.py"))


@pytest.mark.parametrize("name", _modules())
def test_benchmark_imports_without_running(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)) or name == "_harness"


@pytest.mark.parametrize("name", SMOKE_RUN)
def test_benchmark_smoke_mode_runs(name: str) -> None:
    root = BENCHMARKS.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "platform"), str(root)])}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[stamp] commit " in done.stdout  # every result says what code and box it came from


def test_every_benchmark_has_a_smoke_mode() -> None:
    for name in _modules():
        if name != "_harness":
            assert "add_smoke_flag(" in (BENCHMARKS / f"{name}.py").read_text(), name
