"""The dependency rules of docs/architecture.md, read from the source's import statements."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "platform" / "amdahl"

#: Pure modules: no Ray, torch or MLflow at import time, so they load fast and test without them.
PURE = [
    "spec",
    "plan",
    "results",
    "errors",
    "stepclock",
    *[f"report/{p.stem}" for p in (PACKAGE / "report").glob("*.py")],
]
#: Worker-side modules: they never talk to MLflow (the driver is the single writer).
WORKER = ["harness", "sync", "data", "feed", "stepclock", "training", "peak", "worlds"]
HEAVY = ("ray", "torch", "mlflow")


def _imports(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", sorted(set(PURE)))
def test_pure_modules_import_no_heavy_library_at_module_level(module):
    imported = _imports(PACKAGE / f"{module}.py", module_level_only=True)
    assert not {n for n in imported if n.split(".")[0] in HEAVY}


@pytest.mark.parametrize("module", WORKER)
def test_worker_modules_never_reach_the_tracker(module):
    imported = _imports(PACKAGE / f"{module}.py", module_level_only=False)
    assert not {n for n in imported if n.startswith(("amdahl.track", "mlflow"))}


@pytest.mark.parametrize("path", sorted((ROOT / "workloads").glob("*.py")), ids=lambda p: p.name)
def test_workloads_use_only_the_public_api(path):
    imported = _imports(path, module_level_only=False)
    assert {n for n in imported if n.startswith("amdahl")} <= {"amdahl"}


def test_the_cli_loads_nothing_heavy_at_import():
    imported = _imports(PACKAGE / "cli.py", module_level_only=True)
    assert not {n for n in imported if n.split(".")[0] in HEAVY}


def test_a_worker_importing_workload_loads_no_planner_or_report():
    import subprocess
    import sys

    probe = (
        "import sys; from amdahl import Workload; "
        "print(sorted(m for m in sys.modules if m.startswith(('amdahl.report', 'amdahl.plan'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
