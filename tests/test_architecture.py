"""The dependency rules of docs/architecture.md, read from every import statement in the source:
module level, inside functions and under TYPE_CHECKING alike (an import cycle closed by a
function-level import is still a cycle of design)."""

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "platform" / "amdahl"
HEAVY = ("ray", "torch", "mlflow")

#: The bottom: the shared vocabulary and helpers every layer may use.
BASE = {"errors", "files", "columns", "strategies", "workload"}
#: What each part of amdahl may import (besides itself). The driver/worker line is the one that
#: matters most: the two sides meet in the protocol (plain data and pure functions both import);
#: the worker side sees only its own folder, the protocol, the typed train section it receives
#: (spec.schema), the stored data it reads and the base; the driver reaches the worker side only
#: through its entry points (WORKER_ENTRY_POINTS); nothing but the driver and the CLI reaches
#: the driver, and nothing but the CLI reaches the CLI.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "files": set(),
    "columns": set(),
    "strategies": set(),
    "workload": {"errors"},
    "spec": BASE,
    "plan": BASE | {"spec", "analysis"},
    "sweepdir": BASE | {"spec", "plan"},
    "data": BASE,
    "protocol": BASE | {"spec.schema"},
    "worker": BASE | {"protocol", "spec.schema", "data.storage"},
    "analysis": BASE | {"spec"},
    "search": BASE | {"spec", "analysis"},
    "report": BASE | {"spec", "plan", "sweepdir", "analysis", "search"},
    "track": BASE | {"spec", "sweepdir", "analysis", "report"},
    "driver": BASE
    | {"spec", "plan", "sweepdir", "data", "protocol", "worker", "analysis", "search"}
    | {"report", "track"},
    "cli": BASE
    | {"spec", "plan", "sweepdir", "data", "analysis", "search", "report", "track"}
    | {"driver"},
}
#: Pure parts: no Ray, torch or MLflow at import time, so they load fast and test without them.
PURE = ["errors", "files", "columns", "strategies", "spec", "plan", "sweepdir", "analysis"]
PURE += ["search", "report", "protocol", "worker.stepclock", "track.records"]
PURE += ["driver.events"]
#: The only worker modules the driver imports: the launch's training function and the
#: calibration measurement, each run inside Ray Train workers, and the memory probe, run in the
#: driver's process where the data checks run (all else goes through protocol).
WORKER_ENTRY_POINTS = {
    "amdahl.worker.harness",
    "amdahl.worker.calibration_measurement",
    "amdahl.worker.memory_probe",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_in(source: str, module_level_only: bool = False) -> set[str]:
    """The modules a source imports; `from a.b import c` counts as `a.b.c` where that is one of
    amdahl's modules, else as `a.b`. Every statement counts unless `module_level_only`."""
    tree = ast.parse(source)
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # `if TYPE_CHECKING:` blocks at module level run no import
        nodes = [n for n in nodes if not isinstance(n, ast.If)]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "amdahl uses absolute imports"
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in MODULES else node.module)
    return names


@cache
def _imports(module: str, module_level_only: bool = False) -> frozenset[str]:
    return frozenset(imports_in(MODULES[module].read_text(), module_level_only))


def _part(module: str) -> str:
    """A module's part of amdahl: its subpackage, or its own name for a top-level module."""
    return module.split(".")[1] if "." in module else "amdahl"


def _amdahl_imports(module: str) -> set[str]:
    return {n for n in _imports(module) if n.split(".")[0] == "amdahl" and n != module}


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of `graph` (module -> modules it imports) closes."""
    cycles, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                cycles.append(" -> ".join([*path[path.index(n) :], n]))
            elif n not in state:
                visit(n, [*path, n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_there_is_no_import_cycle_through_any_import_statement():
    graph = {m: {n for n in _amdahl_imports(m) if n in MODULES} for m in MODULES}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_cycle_and_passes_a_chain():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_imports_inside_functions_and_type_checking_blocks_count():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from amdahl.spec import schema\n"
        "def f():\n    import amdahl.columns\n"
    )
    assert imports_in(source) >= {"amdahl.spec.schema", "amdahl.columns"}
    assert imports_in(source, module_level_only=True) == {"typing"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "amdahl"))
def test_each_part_imports_only_the_parts_below_it(module):
    part = _part(module)
    allowed = ALLOWED[part.removeprefix("amdahl.")] if part != "amdahl" else set()
    bad = []
    for name in _amdahl_imports(module):
        target = name.split(".", 1)[1] if "." in name else ""
        top = target.split(".")[0]
        if name == "amdahl" and part == "cli":
            continue  # the CLI calls the public API (amdahl/__init__.py)
        if top == part or any(target == a or target.startswith(a + ".") for a in allowed):
            continue
        if top in allowed:
            continue
        bad.append(name)
    assert not bad, f"{module} ({part}/) may not import {sorted(bad)}"


def test_no_two_modules_share_a_file_name():
    """One name per module across the package: a file name says which module it is, without
    its folder (an `__init__.py` is its package's)."""
    folders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            folders.setdefault(path.name, []).append(str(path.parent.relative_to(PACKAGE)))
    shared = {name: where for name, where in folders.items() if len(where) > 1}
    assert not shared, f"file names used more than once (name: folders): {shared}"


def test_the_rule_table_covers_every_part():
    parts = {_part(m) for m in MODULES} - {"amdahl"}
    assert parts == set(ALLOWED)


@pytest.mark.parametrize("part", PURE)
def test_pure_parts_import_no_heavy_library_at_module_level(part):
    for module in MODULES:
        if module == f"amdahl.{part}" or module.startswith(f"amdahl.{part}."):
            imported = _imports(module, module_level_only=True)
            assert not {n for n in imported if n.split(".")[0] in HEAVY}, module


def test_pure_parts_load_no_heavy_library_through_their_imports_either():
    """What a pure module imports from amdahl must be pure too: importing them all, in a fresh
    interpreter, loads none of Ray, torch or MLflow."""
    pure = [
        m for m in MODULES if any(m == f"amdahl.{p}" or m.startswith(f"amdahl.{p}.") for p in PURE)
    ]
    probe = (
        f"import sys; import {', '.join(sorted(pure))}; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _part(m) == "driver"))
def test_the_driver_reaches_the_worker_side_only_through_its_entry_points(module):
    """The driver hands work to the workers through the protocol (plain data that crosses
    processes) and starts them with an entry point; it imports no other worker module."""
    reached = {n for n in _amdahl_imports(module) if _part(n) == "worker" and n in MODULES}
    assert reached <= WORKER_ENTRY_POINTS, f"{module} imports {sorted(reached)}"


def test_the_worker_entry_points_exist_and_are_at_most_three():
    assert WORKER_ENTRY_POINTS <= set(MODULES) and len(WORKER_ENTRY_POINTS) <= 3


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _part(m) == "worker"))
def test_worker_modules_never_reach_the_tracker(module):
    assert not {n for n in _imports(module) if n.startswith(("amdahl.track", "mlflow"))}


@pytest.mark.parametrize("path", sorted((ROOT / "workloads").glob("*.py")), ids=lambda p: p.name)
def test_workloads_use_only_the_public_api(path):
    tree = ast.parse(path.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {n for n in imported if n.startswith("amdahl")} <= {"amdahl"}


@pytest.mark.parametrize(
    "module",
    sorted(m for m in MODULES if _part(m) == "cli")
    + ["amdahl.driver.cluster", "amdahl.driver.calibrate"],
)
def test_what_the_cli_imports_loads_nothing_heavy_at_import(module):
    """`platform --help` stays instant, and `platform plan` loads no Ray: the CLI and the
    driver import Ray, torch and MLflow (and the worker side) inside the functions that use
    them."""
    imported = _imports(module, module_level_only=True)
    assert not {n for n in imported if n.split(".")[0] in HEAVY}


def test_only_the_cluster_module_starts_ray():
    """Ray is initialised in one place, `driver.cluster.connect_ray`, whoever needs it."""
    callers = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "init"
                and isinstance(func.value, ast.Name)
                and func.value.id == "ray"
            ):
                callers.append(module)
    assert callers and set(callers) == {"amdahl.driver.cluster"}


def test_a_worker_importing_workload_loads_no_planner_or_report():
    probe = (
        "import sys; from amdahl import Workload; "
        "print(sorted(m for m in sys.modules if m.startswith(('amdahl.report', 'amdahl.plan'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


#: A module with one job reads in one sitting; a function longer than this does several things.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_stay_short(module):
    source = MODULES[module].read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, f"{module}: split it along its seams"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{module}: {long}"
