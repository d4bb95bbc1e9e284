"""The docs cite only modules that exist. Read from docs/*.md, README.md and cluster.yaml:

- every path ending in `.py` (`worker/trial.py`, `amdahl/report/compute.py`,
  `platform/amdahl/x/y.py`, `benchmarks/x.py`, `tests/unit/x.py`) names a file: package-relative
  paths under platform/amdahl/, paths starting with a top-level folder under the repository;
- every module in docs/architecture.md's layout tree exists where the tree puts it, and the
  tree lists every module of the package (`__init__.py` of a subpackage aside);
- every dotted citation of a module in backticks (`worker.rows.row_identity`,
  `columns.AXES`) names a module that exists and a name it holds. Two-part citations of a
  subpackage (`search.objective`, `report.cost_per_device_hour`) are left out: they read the
  same as the sweep file's keys.

When a module moves or is renamed, this test names each citation it left behind.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "platform" / "amdahl"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "cluster.yaml"]
#: Paths starting with these are relative to the repository root; any other is package-relative.
ROOT_FOLDERS = ("platform/", "workloads/", "benchmarks/", "tests/", "sweeps/", ".ci/")
#: Paths the docs show as a user's own files, not this repository's.
USER_FILES = {"mypkg/models.py"}

#: A path with at least one folder, ending in .py (not inside a URL or a longer name).
PY_PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w-]+\.py)(?!\w)")
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
TOP_MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
_FIRST = "|".join(SUBPACKAGES + TOP_MODULES)
DOTTED = re.compile(rf"(?<![\w./])((?:{_FIRST})(?:\.\w+)+)")
#: File suffixes that make `plan.json` or `driver.lock` a file name, not a module.
NOT_MODULES = {"py", "yaml", "json", "md", "lock", "parquet", "log", "html"}


def _resolves(path: str) -> bool:
    path = path.removeprefix("./")
    if path.startswith("amdahl/"):
        return (ROOT / "platform" / path).is_file()
    if path.startswith(ROOT_FOLDERS):
        return (ROOT / path).is_file()
    return (PACKAGE / path).is_file()


def _lines(doc: Path):
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        yield f"{doc.relative_to(ROOT)}:{number}", line


def test_every_cited_py_path_exists():
    missing = [
        f"{where}: {path}"
        for doc in DOCS
        for where, line in _lines(doc)
        for path in PY_PATH.findall(line)
        if path not in USER_FILES and not _resolves(path)
    ]
    assert not missing, "docs cite files that do not exist:\n" + "\n".join(missing)


def _layout_tree() -> list[tuple[str, str]]:
    """(where, module path relative to the package) for each module in architecture.md's tree
    (the code block that opens with `platform/amdahl/`)."""
    lines = list(_lines(ROOT / "docs" / "architecture.md"))
    start = next(i for i, (_, line) in enumerate(lines) if line.strip() == "platform/amdahl/")
    modules, folders = [], []
    for where, line in lines[start + 1 :]:
        if line.startswith("```"):
            break
        depth = (len(line) - len(line.lstrip())) // 2 - 1
        entry = re.match(r"\s*((?:\w+\.py, )*\w+(?:\.py|/))(?:\s|$)", line)
        if not entry:
            continue  # a description's second line
        if entry[1].endswith("/"):
            folders[depth:] = [entry[1].rstrip("/")]
            continue
        modules += [(where, "/".join([*folders[:depth], n])) for n in entry[1].split(", ")]
    return modules


def test_the_layout_tree_lists_every_module_where_it_is():
    tree = _layout_tree()
    missing = [f"{where}: {path}" for where, path in tree if not (PACKAGE / path).is_file()]
    assert not missing, "architecture.md's tree lists modules that do not exist:\n" + "\n".join(
        missing
    )
    listed = {path for _, path in tree}
    unlisted = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.stem != "__init__" or p.parent == PACKAGE
        if str(p.relative_to(PACKAGE)) not in listed
    )
    assert not unlisted, "architecture.md's tree leaves out: " + ", ".join(unlisted)


def _dotted_problem(ref: str) -> str | None:
    """Why `ref` (`worker.rows.row_identity`) names no module and name of the package, or None."""
    parts = ref.split(".")
    if parts[-1] in NOT_MODULES or (parts[0] in SUBPACKAGES and len(parts) < 3):
        return None
    folder, i = PACKAGE, 0
    while i < len(parts) and (folder / parts[i]).is_dir():
        folder, i = folder / parts[i], i + 1
    if i == len(parts) or not (folder / f"{parts[i]}.py").is_file():
        return "no such module"
    module = folder / f"{parts[i]}.py"
    name = parts[i + 1] if i + 1 < len(parts) else None
    if name and not re.search(rf"\b{re.escape(name)}", module.read_text()):
        return f"{module.relative_to(PACKAGE)} has no {name}"
    return None


def test_every_dotted_module_citation_exists():
    missing = [
        f"{where}: {ref} ({problem})"
        for doc in DOCS
        for where, line in _lines(doc)
        for quoted in re.findall(r"`([^`]+)`", line)
        for ref in DOTTED.findall(quoted)
        if (problem := _dotted_problem(ref))
    ]
    assert not missing, "docs cite modules that do not exist:\n" + "\n".join(missing)
