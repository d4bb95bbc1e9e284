"""Every key analysis/, report/, search/ and track/ read from a results row is a column of
`columns.COLUMNS`: a renamed or dropped column cannot leave a reader behind that silently sees
None (as `grad_bytes` did: read by the step-time model and the diagnosis, never written, dropped
by the table on append). No reader adds fields of its own to rows and reads them back (search's
`{**row, "status": "pending"}` sets a column), so there is no list of derived fields; one that
is needed belongs next to COLUMNS, defined once.

Found statically, from the source, with a light type inference per function:

- a *row* is a parameter annotated `dict[str, Any]` named `row` or `r`; an element of a row list
  (a `for` or comprehension target, `rows[i]`, `next(...)` over rows); a copy (`{**row, ...}`);
- a *row list* is a parameter annotated `list[dict[str, Any]]` (or Iterable/Sequence) whose
  name is in ROW_LIST_PARAMS; `.rows` / `.ok_rows` of a `Config` (a parameter annotated
  `Config`, an element of a `list[Config]` or of `group_configs(...)`, `self` inside `Config`,
  `.config` of anything) or of the report's inputs; `read_results(...).to_pylist()`; what the
  functions in ROW_CALLS return; a list, filter or sort of a row list; a name assigned any of
  these; the values of a dict of rows or of row lists (`rows_by_rung(...)`, a
  `by_*: dict[str, dict[str, Any]]`);
- a *read* is `row["key"]`, `row.get("key")`, `"key" in row`, or a string constant passed to a
  column-reading helper (COLUMN_HELPERS: `Config.stat("key")`, ...).

Dicts that are not rows (settings, calibration.json, plan.json, trace events, MLflow params)
are never looked at, so nothing needs allowing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from amdahl.columns import COLUMNS

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "amdahl"
READERS = ("analysis", "report", "search", "track")

#: Row-list parameters, by name (a `list[dict[str, Any]]` named otherwise, e.g. trace
#: `events`, is not rows).
ROW_LIST_PARAMS = {"rows", "candidates", "measured", "first_rung", "kept", "ok"}
#: Column-reading helpers: function or method name -> which positional argument is a column.
COLUMN_HELPERS = {"stat": 0, "own_or_trials": 1}

ROW, ROWS, CONFIG, CONFIGS, INPUTS = "row", "rows", "config", "configs", "inputs"
#: Dicts keyed by something (a trial id) whose values are rows, or row lists.
ROW_BY, ROWS_BY = "row by key", "rows by key"
_DICT = {"dict[str, Any]", "Mapping[str, Any]"}
_LISTS = {f"{c}[{d}]" for c in ("list", "Iterable", "Sequence") for d in _DICT}
_ELEMENT = {ROWS: ROW, CONFIGS: CONFIG, ROW_BY: ROW, ROWS_BY: ROWS}
#: Functions that return rows, by what they return.
ROW_CALLS = {
    "final_rows": ROWS,
    "rows_by_rung": ROWS_BY,
    "_merged": ROW_BY,
    "group_configs": CONFIGS,
}


def _annotation_kind(name: str, annotation: ast.expr | None) -> str | None:
    text = ast.unparse(annotation) if annotation is not None else ""
    text = text.replace(" | None", "")
    if text in _DICT and name in ("row", "r"):
        return ROW
    if text in _LISTS and name in ROW_LIST_PARAMS:
        return ROWS
    if text == "Config":
        return CONFIG
    if text in ("list[Config]", "Iterable[Config]", "Sequence[Config]"):
        return CONFIGS
    if text == "ReportInputs":
        return INPUTS
    if text.startswith("dict[") and any(text.endswith(f", {d}]") for d in _DICT):
        return ROW_BY if name.startswith("by") else None
    if text.startswith("dict[") and any(text.endswith(f", {lst}]") for lst in _LISTS):
        return ROWS_BY
    return None


class _Reads(ast.NodeVisitor):
    """Walks one module, yielding (line, key) for each key read from a row."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, str]] = []
        self.scopes: list[dict[str, str]] = [{}]
        self.classes: list[str] = []

    # -- scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        env = dict(self.scopes[-1])
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            env.pop(a.arg, None)
            if kind := _annotation_kind(a.arg, a.annotation):
                env[a.arg] = kind
        if self.classes and self.classes[-1] == "Config" and args.args:
            env[args.args[0].arg] = CONFIG
        self.scopes.append(env)
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    @property
    def env(self) -> dict[str, str]:
        return self.scopes[-1]

    # -- kinds of expressions
    def kind(self, node: ast.expr) -> str | None:  # noqa: C901, PLR0911
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.kind(node.value)
            if node.attr in ("rows", "ok_rows") and owner in (CONFIG, INPUTS):
                return ROWS
            return {"config": CONFIG, "configs": CONFIGS}.get(node.attr)
        if isinstance(node, ast.Call):
            return self._call_kind(node)
        if isinstance(node, ast.Subscript):
            return _ELEMENT.get(self.kind(node.value))
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            self._bind_generators(node.generators)
            element = self.kind(node.elt)
            return ROWS if element == ROW else CONFIGS if element == CONFIG else None
        if isinstance(node, ast.DictComp):
            self._bind_generators(node.generators)
            return ROW_BY if self.kind(node.value) == ROW else None
        if isinstance(node, ast.Dict):
            spread = [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
            return ROW if any(self.kind(v) == ROW for v in spread) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ROWS if ROWS in (self.kind(node.left), self.kind(node.right)) else None
        if isinstance(node, ast.IfExp):
            return self.kind(node.body) or self.kind(node.orelse)
        return None

    def _call_kind(self, node: ast.Call) -> str | None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        first = self.kind(node.args[0]) if node.args else None
        if name in ROW_CALLS:
            return ROW_CALLS[name]
        if name == "get" and isinstance(func, ast.Attribute):
            owner = self.kind(func.value)
            return _ELEMENT[owner] if owner in (ROW_BY, ROWS_BY) else None
        if name == "to_pylist" and isinstance(func, ast.Attribute):
            inner = func.value
            if isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "read_results":
                return ROWS
        if name in ("list", "sorted", "reversed", "filter") and first in (ROWS, CONFIGS):
            return first
        if name == "next" and first in (ROWS, CONFIGS):
            return ROW if first == ROWS else CONFIG
        if name == "dict" and first == ROW:
            return ROW
        if name in ("min", "max") and first in (ROWS, CONFIGS):
            return _ELEMENT[first]
        return None

    def _element(self, iterable: ast.expr) -> str | None:
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Attribute)
            and iterable.func.attr == "values"
        ):
            return _ELEMENT.get(self.kind(iterable.func.value))
        kind = self.kind(iterable)
        return ROW if kind == ROWS else CONFIG if kind == CONFIGS else None

    def _bind(self, target: ast.expr, iterable: ast.expr) -> None:
        """Bind a loop target to the kind of what it iterates (`zip` and `enumerate` by
        position)."""
        if isinstance(target, ast.Name):
            self._set(target.id, self._element(iterable))
            return
        if not isinstance(target, ast.Tuple) or not isinstance(iterable, ast.Call):
            return
        func = getattr(iterable.func, "id", "")
        method = iterable.func
        if isinstance(method, ast.Attribute) and method.attr == "items" and len(target.elts) == 2:
            value = self.kind(method.value)
            if value in (ROW_BY, ROWS_BY) and isinstance(target.elts[1], ast.Name):
                self._set(target.elts[1].id, _ELEMENT[value])
        if func == "zip":
            for t, it in zip(target.elts, iterable.args, strict=False):
                self._bind(t, it)
        elif func == "enumerate" and len(target.elts) == 2 and iterable.args:
            self._bind(target.elts[1], iterable.args[0])

    def _set(self, name: str, kind: str | None) -> None:
        if kind:
            self.env[name] = kind
        else:
            self.env.pop(name, None)

    def _bind_generators(self, generators: list[ast.comprehension]) -> None:
        for g in generators:
            self._bind(g.target, g.iter)

    # -- bindings
    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self._bind(node.target, node.iter)
        for statement in [*node.body, *node.orelse]:
            self.visit(statement)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        kind = self.kind(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                self._set(target.id, kind)
            else:
                self.visit(target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        if isinstance(node.target, ast.Name):
            kind = _annotation_kind(node.target.id, node.annotation)
            self._set(node.target.id, kind or (node.value and self.kind(node.value)))

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._set(node.target.id, self.kind(node.value))

    def visit_comprehension_owner(self, node: ast.ListComp) -> None:
        self._bind_generators(node.generators)
        self.generic_visit(node)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_comprehension_owner

    # -- reads
    def _read(self, node: ast.AST, key: ast.expr) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            self.reads.append((node.lineno, key.value))

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.kind(node.value) == ROW:
            self._read(node, node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, (ast.In, ast.NotIn)) and self.kind(right) == ROW:
                self._read(node, node.left)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        sorts = getattr(func, "id", "") in ("sorted", "min", "max", "any", "all")
        element = _ELEMENT.get(self.kind(node.args[0])) if sorts and node.args else None
        for keyword in node.keywords if element else ():
            if isinstance(keyword.value, ast.Lambda) and keyword.value.args.args:
                self.env[keyword.value.args.args[0].arg] = element
        if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
            if self.kind(func.value) == ROW:
                self._read(node, node.args[0])
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        at = COLUMN_HELPERS.get(name)
        if at is not None and len(node.args) > at:
            receiver_ok = name != "stat" or self.kind(getattr(func, "value", func)) == CONFIG
            if receiver_ok:
                self._read(node, node.args[at])
        self.generic_visit(node)


def row_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every key `source` reads from a results row."""
    walker = _Reads()
    walker.visit(ast.parse(source))
    return walker.reads


def _modules() -> Iterator[Path]:
    for folder in READERS:
        yield from sorted((PACKAGE / folder).rglob("*.py"))


def test_every_key_read_from_a_row_is_a_column():
    unknown = [
        f"{module.relative_to(PACKAGE)}:{line}: {key!r}"
        for module in _modules()
        for line, key in row_reads(module.read_text())
        if key not in COLUMNS
    ]
    assert not unknown, "keys read from rows that no row holds:\n" + "\n".join(unknown)


def test_the_readers_are_found():
    """The inference finds the row reads that matter (a change that blinds it fails here,
    not silently)."""
    found = {
        (module.relative_to(PACKAGE).as_posix(), key)
        for module in _modules()
        for _, key in row_reads(module.read_text())
    }
    expected = {
        ("analysis/configs.py", "throughput"),  # Config.ok_rows, Config.stat
        ("analysis/configs.py", "measured_s"),  # _step_wall(row)
        ("search/halving.py", "trial_id"),
        ("report/diagnose.py", "status"),  # any(... for r in o.rows)
        ("report/diagnose.py", "data_wait_s"),  # c.stat("data_wait_s")
        ("track/child_run.py", "trial_id"),
    }
    assert expected <= found
    assert {module.split("/")[0] for module, _ in found} == set(READERS)


@pytest.mark.parametrize(
    ("source", "key"),
    [
        ('def f(row: dict[str, Any]):\n    return row["grad_bytes"]', "grad_bytes"),
        (
            'def f(rows: list[dict[str, Any]]):\n    return [r.get("thruput") for r in rows]',
            "thruput",
        ),
        ('def f(c: Config):\n    return c.stat("step_tme_s")', "step_tme_s"),
        ('def f(c: Config):\n    return next(r for r in c.ok_rows if "mfuu" in r)', "mfuu"),
    ],
)
def test_a_misspelt_key_is_caught(source, key):
    assert [k for _, k in row_reads(source)] == [key]
    assert key not in COLUMNS


def test_dicts_that_are_not_rows_are_left_alone():
    source = (
        "def f(settings: dict[str, Any], events: list[dict[str, Any]], t: Table):\n"
        '    return settings["trial"], [e["ts"] for e in events], [r["x"] for r in t.rows]'
    )
    assert row_reads(source) == []
