"""The docs cite only modules that exist. Read from docs/*.md, README.md and cluster.yaml:

- every path ending in `.py` (`worker/trial.py`, `amdahl/report/compute.py`,
  `platform/amdahl/x/y.py`, `benchmarks/x.py`, `tests/unit/x.py`) names a file: package-relative
  paths under platform/amdahl/, paths starting with a top-level folder under the repository;
- every module in docs/architecture.md's layout tree exists where the tree puts it, and the
  tree lists every module of the package (`__init__.py` of a subpackage aside);
- every dotted citation in backticks that starts with a module or subpackage of the package
  (`protocol.identity.row_identity`, `columns.AXES`, `driver.pool.LaunchPool.run`, with or
  without a leading `amdahl.`) is checked whole: the module exists, it defines the name (a
  module that merely imports it is the wrong place to send a reader; a package's `__init__`
  re-exports count), and each further part is defined in the class before it. A two-part
  citation of a subpackage (`search.halving`, `report.write_reports`) names one of its modules
  or a name its `__init__` holds, or else a key of the sweep file's section of that name
  (`search.objective`, `report.cost_per_device_hour`, checked against `spec.schema`).

When a module moves or is renamed, this test names each citation it left behind.
"""

from __future__ import annotations

import ast
import functools
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from amdahl.cli.commands import main
from amdahl.spec.schema import SweepSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "platform" / "amdahl"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "cluster.yaml"]
#: Paths starting with these are relative to the repository root; any other is package-relative.
ROOT_FOLDERS = ("platform/", "workloads/", "benchmarks/", "tests/", "sweeps/", ".ci/")
#: Paths the docs show as a user's own files (or what `platform init` writes), not the repository's.
USER_FILES = {"mypkg/models.py", "mymodel/myworkload.py"}

#: A path with at least one folder, ending in .py (not inside a URL or a longer name).
PY_PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w-]+\.py)(?!\w)")
SUBPACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
TOP_MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
_FIRST = "|".join(SUBPACKAGES + TOP_MODULES)
DOTTED = re.compile(rf"(?<![\w./])(?:amdahl\.)?((?:{_FIRST})(?:\.\w+)+\*?)")
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


def _defined(body: list[ast.stmt], imports: bool) -> dict[str, ast.AST]:
    """The names a module's or class's `body` binds (functions, classes, assignments, annotated
    fields; with `imports`, imported names too), each with the node that binds it. Statements
    under `if` and `try` count: a name bound there exists in the module."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif imports and isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", []))):
                names.update(_defined(block, imports))
    return names


@functools.cache
def _module_names(module: Path) -> dict[str, ast.AST]:
    return _defined(ast.parse(module.read_text()).body, imports=module.name == "__init__.py")


def _sweep_key(section: str, key: str) -> bool:
    """Whether `section.key` is a key of the sweep file (`search.objective`)."""
    field = SweepSpec.model_fields.get(section)
    model = field.annotation if field else None
    return key in getattr(model, "model_fields", {})


def _dotted_problem(ref: str) -> str | None:
    """Why `ref` (`protocol.identity.row_identity`) names no module and name of the package,
    or None."""
    parts = ref.split(".")
    if parts[-1] in NOT_MODULES:
        return None
    folder, i = PACKAGE, 0
    while i < len(parts) and (folder / parts[i]).is_dir():
        folder, i = folder / parts[i], i + 1
    if i < len(parts) and (folder / f"{parts[i]}.py").is_file():
        module, i = folder / f"{parts[i]}.py", i + 1
    elif i == len(parts):
        return None  # a subpackage
    elif i > 0 and (folder / "__init__.py").is_file():
        module = folder / "__init__.py"
        if len(parts) == 2 and parts[1] not in _module_names(module):
            if _sweep_key(*parts):
                return None
            return f"no module {parts[1]} in {parts[0]}/, nor a name or sweep-file key"
    else:
        return "no such module"
    scope, where = _module_names(module), module.relative_to(PACKAGE)
    for name in parts[i:]:
        if name.endswith("*"):  # `plan.trials.ID_SCHEMA_1_*`: some names with that prefix
            if not any(n.startswith(name[:-1]) for n in scope):
                return f"{where} defines no {name}"
            return None
        if name not in scope:
            return f"{where} defines no {name}"
        node = scope[name]
        scope = _defined(node.body, imports=False) if isinstance(node, ast.ClassDef) else {}
        where = name
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


def test_the_citation_check_reads_each_citation_whole():
    """The stale citations a check by module alone let through are refused; sweep-file keys,
    re-exports and class members pass."""
    stale = [
        "worker.rows.row_identity",  # rows.py imports it; protocol/identity.py defines it
        "search.anchors",
        "driver.halving",
        "driver.pool.LaunchPool.no_such_method",
        "plan.trials.NO_SUCH_*",
    ]
    assert [ref for ref in stale if _dotted_problem(ref) is None] == []
    assert DOTTED.findall("amdahl.worker.rows.row_identity") == ["worker.rows.row_identity"]
    sound = [
        "protocol.identity.row_identity",
        "search.objective",
        "report.cost_per_device_hour",
        "report.write_reports",
        "search.halving",
        "driver.measurement.Measurement.record",
        "plan.trials.ID_SCHEMA_1_*",
        "plan.json",
    ]
    assert {ref: _dotted_problem(ref) for ref in sound} == dict.fromkeys(sound)


def _schema_keys(model, prefix: str = "") -> list[str]:
    """Every key of the sweep file, walked from the schema itself (not from the renderer)."""
    from amdahl.spec.reference import _section_of

    keys = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section_of(info.annotation)
        if key == "grid.options":
            keys.append("grid.options.<name>")
            continue
        keys.append(key)
        if section is not None:
            keys += _schema_keys(section, key + ".")
    return keys


def test_the_sweep_file_reference_is_the_schemas_and_names_every_key() -> None:
    from amdahl.spec.reference import PAGE, reference_markdown

    page = (ROOT / PAGE).read_text()
    missing = [k for k in _schema_keys(SweepSpec) if f"| `{k}` |" not in page]
    assert not missing, f"{PAGE} lacks {missing}: run python -m amdahl.spec.reference --write"
    assert page == reference_markdown(), (
        f"{PAGE} differs from the schema: run python -m amdahl.spec.reference --write"
    )


#: A markdown link's target: [text](target), the target without its #anchor.
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_anchor(m) for m in re.findall(r"^#+ (.*)$", doc.read_text(), flags=re.M)}


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for doc in [d for d in DOCS if d.suffix == ".md"]:
        for where, line in _lines(doc):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                file = (doc.parent / path).resolve() if path else doc
                if not file.exists() or (
                    anchor and file.suffix == ".md" and anchor not in _anchors(file)
                ):
                    broken.append(f"{where}: {target}")
    assert not broken, "broken relative links: " + "; ".join(broken)


def test_no_link_text_spans_two_lines() -> None:
    """The link check reads a line at a time, so a link broken over two lines would go unread."""
    split = [
        f"{doc.relative_to(ROOT)}:{doc.read_text()[: m.start()].count(chr(10)) + 1}"
        for doc in DOCS
        if doc.suffix == ".md"
        for m in re.finditer(r"\[[^\]\n]*\n[^\]]*\]\(", doc.read_text())
    ]
    assert not split, "links split over two lines: " + ", ".join(split)


def test_the_performance_goals_table_reads_at_a_glance() -> None:
    """Each goal's current figure fits a table cell; a run's history goes to its own page."""
    text = (ROOT / "docs" / "performance.md").read_text()
    long = [
        f"docs/performance.md:{n}: {len(cell)} characters"
        for n, line in enumerate(text.splitlines(), 1)
        if line.startswith("|")
        for cell in line.strip("|").split(" | ")
        if len(cell) > 400
    ]
    assert not long, "table cells over 400 characters (move the history out): " + "; ".join(long)


README = ROOT / "README.md"


def test_the_readme_is_a_quickstart_and_the_architecture_a_map() -> None:
    """The README stays a quickstart (the guide holds the rest) with one light picture, and
    architecture.md a map a maintainer reads in one sitting."""
    assert len(README.read_text().splitlines()) <= 300, "README.md: move the detail into docs/"
    architecture = ROOT / "docs" / "architecture.md"
    assert len(architecture.read_text().splitlines()) <= 360, "architecture.md: a map, not a guide"
    assert (ROOT / "docs" / "img" / "report.png").stat().st_size < 300_000


def test_the_guide_index_lists_every_page_and_ends_with_the_map() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    linked = [target.partition("#")[0] for target in LINK.findall(index)]
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert sorted(pages - set(linked)) == [], "docs/index.md leaves pages out"
    assert linked[-1] == "architecture.md"


def _bash_lines(text: str) -> list[str]:
    """The lines of a Markdown text's bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]


def _readme_commands() -> list[list[str]]:
    """The arguments of every `platform ...` command in the README's bash blocks, each command
    of an `&&` chain apart, comments left out."""
    commands = []
    for line in _bash_lines(README.read_text()):
        command: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word != "&&":
                command.append(word)
                continue
            if command[:1] == ["platform"]:
                commands.append(command[1:])
            command = []
    return commands


def test_the_readme_gives_the_two_setup_commands_ci_runs() -> None:
    """.ci/run and the task's rules read the README's first block as exactly two commands: the
    main job and the tests."""
    first = _bash_lines(README.read_text())[:2]
    assert [shlex.split(line, comments=True) for line in first] == [
        shlex.split("pip install -e . && platform sweep sweeps/laptop.yaml"),
        shlex.split("pip install -e '.[test]' && pytest"),
    ]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert shlex.split(ci.replace(" -q", "")) == shlex.split(first[1], comments=True)


def _parse(args: list[str], group: click.Group = main) -> click.Context:
    """`platform ARGS` parsed as click would run it (the command exists, its options and
    arguments parse), without running it."""
    name, *rest = args
    command = group.get_command(click.Context(group), name)
    assert command is not None, f"platform has no command {name!r}"
    if isinstance(command, click.Group):
        return _parse(rest, command)
    return command.make_context(name, rest)


def test_every_platform_command_in_the_readme_parses() -> None:
    commands = _readme_commands()
    assert {c[0] for c in commands} >= {"plan", "sweep", "report", "init"}
    failed = []
    for args in commands:
        try:
            _parse(args)
        except (click.UsageError, AssertionError) as error:
            failed.append(f"platform {shlex.join(args)}: {error}")
    assert not failed, "README commands that do not parse:\n" + "\n".join(failed)


def test_the_refusal_of_a_command_that_does_not_parse() -> None:
    """The check above fails on a command or an option the CLI lacks."""
    for args in (["plans", "sweeps/laptop.yaml"], ["plan", "sweeps/laptop.yaml", "--fast"]):
        with pytest.raises((click.UsageError, AssertionError)):
            _parse(args)


@pytest.fixture
def user_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's shell at the repository root with no Ray cluster to join (RAY_ADDRESS unset, a
    Ray temp directory with no record of `ray start`, no Ray in this process); the modules a
    command imports from tmp_path (what `platform init` wrote) are forgotten after."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    if (ray := sys.modules.get("ray")) is not None:
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_the_readmes_plan_and_init_commands_run_as_written(
    user_shell: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`platform plan` (seconds, no Ray) runs as the README writes it; `platform init` writes a
    workload whose sweep file plans as written, from the folder the README says to cd into."""
    commands = _readme_commands()
    plans = [args for args in commands if args[0] == "plan"]
    inits = [args for args in commands if args[0] == "init"]
    assert plans and inits
    runner = CliRunner()
    for args in plans:
        result = runner.invoke(main, args)
        assert result.exit_code == 0, f"platform {shlex.join(args)}:\n{result.output}"
    for args in inits:
        monkeypatch.chdir(user_shell)
        assert runner.invoke(main, args).exit_code == 0
        monkeypatch.chdir(user_shell / args[1])
        planned = runner.invoke(main, ["plan", "sweep.yaml"])
        assert planned.exit_code == 0, planned.output
        assert "will not run" not in planned.output
