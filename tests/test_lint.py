"""The test command's own checks: ruff (lint + format), so CI and a developer run the same
checks, and every integration test file marked `integration` (so `-m "not integration"` runs
the fast suite without a Ray cluster)."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INTEGRATION = sorted((ROOT / "tests" / "integration").glob("test_*.py"))


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency: pip install -e '.[test]'"
    done = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _is_integration_mark(node: ast.expr) -> bool:
    """`pytest.mark.integration`, as written in a module's `pytestmark`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "integration"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    )


def module_marks_integration(source: str) -> bool:
    """Whether a module sets `pytestmark` at module level to `pytest.mark.integration`, or to
    a list or tuple holding it."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        marks = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
        return any(_is_integration_mark(m) for m in marks)
    return False


@pytest.mark.parametrize("path", INTEGRATION, ids=lambda p: p.name)
def test_every_integration_test_file_is_marked_integration(path: Path) -> None:
    assert module_marks_integration(path.read_text()), (
        f"{path.relative_to(ROOT)}: add `pytestmark = pytest.mark.integration` at module level "
        "(or add the mark to its pytestmark list)"
    )


@pytest.mark.parametrize(
    "source, marked",
    [
        ("import pytest\npytestmark = pytest.mark.integration\n", True),
        ("pytestmark = [pytest.mark.slow, pytest.mark.integration]\n", True),
        ("pytestmark = (pytest.mark.integration,)\n", True),
        ("pytestmark = pytest.mark.gpu\n", False),
        ("pytestmark = [pytest.mark.gpu]\n", False),
        ("def test_x():\n    pytestmark = pytest.mark.integration\n", False),
        ("@pytest.mark.integration\ndef test_x():\n    pass\n", False),
        ("import pytest\n", False),
    ],
)
def test_the_integration_mark_check_tells_marked_from_unmarked(source: str, marked: bool) -> None:
    assert module_marks_integration(source) is marked


def test_test_modules_have_unique_basenames() -> None:
    """pytest imports test modules by basename (no __init__.py in the test folders): two files
    of one name in different folders stop the whole run at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
