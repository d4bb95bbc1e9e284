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
    "sweepdir",
    "strategies",
    "launch",
    "search",
    "track_backend",
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


def test_pure_modules_load_no_heavy_library_through_their_imports_either():
    """What a pure module imports from amdahl must be pure too: importing them all, in a fresh
    interpreter, loads none of Ray, torch or MLflow."""
    import subprocess
    import sys

    modules = ["amdahl." + m.removesuffix("/__init__").replace("/", ".") for m in sorted(PURE)]
    probe = (
        f"import sys; import {', '.join(modules)}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", WORKER)
def test_worker_modules_never_reach_the_tracker(module):
    imported = _imports(PACKAGE / f"{module}.py", module_level_only=False)
    assert not {n for n in imported if n.startswith(("amdahl.track.tracker", "mlflow"))}


@pytest.mark.parametrize("path", sorted((ROOT / "workloads").glob("*.py")), ids=lambda p: p.name)
def test_workloads_use_only_the_public_api(path):
    imported = _imports(path, module_level_only=False)
    assert {n for n in imported if n.startswith("amdahl")} <= {"amdahl"}


@pytest.mark.parametrize("module", ["cli", "cluster", "calibrate", "progress"])
def test_what_the_cli_imports_loads_nothing_heavy_at_import(module):
    """`platform --help` stays instant, and `platform plan` loads no Ray (cluster.py imports
    ray inside the functions that talk to a running Ray)."""
    imported = _imports(PACKAGE / f"{module}.py", module_level_only=True)
    assert not {n for n in imported if n.split(".")[0] in HEAVY}


def test_the_sweep_directory_module_sits_below_every_other():
    """results.py and spec.py may take file names from sweepdir: it imports neither at module
    level (nor anything else of amdahl's but errors and files), so there is no import cycle."""
    imported = _imports(PACKAGE / "sweepdir.py", module_level_only=True)
    assert {n for n in imported if n.startswith("amdahl")} <= {"amdahl.errors", "amdahl.files"}


def test_only_cluster_starts_ray():
    """Ray is initialised in one place, `cluster.connect_ray`, whoever needs it."""
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "init"
                and isinstance(func.value, ast.Name)
                and func.value.id == "ray"
            ):
                callers.append(path.relative_to(PACKAGE).as_posix())
    assert callers and set(callers) == {"cluster.py"}


def test_a_worker_importing_workload_loads_no_planner_or_report():
    import subprocess
    import sys

    probe = (
        "import sys; from amdahl import Workload; "
        "print(sorted(m for m in sys.modules if m.startswith(('amdahl.report', 'amdahl.plan.trials'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
