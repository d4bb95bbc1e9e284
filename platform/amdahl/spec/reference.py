"""The sweep-file reference (docs/sweep-file.md), generated from the schema's own fields.

Each key's type, default and meaning come from spec.schema (its pydantic fields and their
descriptions), so the page cannot drift from what the loader accepts: tests/test_docs.py fails
when the committed page differs from what this module writes, and

    python -m amdahl.spec.reference --write

rewrites it. Pure: pydantic and the schema only.
"""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from amdahl.spec.schema import SweepSpec

#: Where the page lives, from the repository root.
PAGE = Path("docs") / "sweep-file.md"

_HEADER = """\
# Sweep-file reference

Every key a sweep file takes, section by section: its type, its default and what it does.
Only `workload` is required. An unknown key is refused with a "did you mean", and a bad value
with the YAML path, the value and the fix (exit code 2), before anything launches.

This page is generated from the schema (`spec.schema`) by `python -m amdahl.spec.reference
--write`; `tests/test_docs.py` fails when it is out of date. The guide to writing a sweep file
is [sweeps.md](sweeps.md); the sweep files in `sweeps/` are worked examples.
"""


def _bounds(metadata: list[Any]) -> str:
    """`>= 1`, `> 0`, `in (0, 1]`: a number's constraints as a reader writes them."""
    low = high = ""
    for m in metadata:
        if isinstance(m, at.Ge):
            low = f"[{m.ge}"
        elif isinstance(m, at.Gt):
            low = f"({m.gt}"
        elif isinstance(m, at.Le):
            high = f"{m.le}]"
        elif isinstance(m, at.Lt):
            high = f"{m.lt})"
    if low and high:
        return f" in {low}, {high}"
    if low:
        return (" >= " if low[0] == "[" else " > ") + low[1:]
    return (" <= " if high.endswith("]") else " < ") + high[:-1] if high else ""


_NAMES = {int: "int", float: "float", str: "string", bool: "bool", dict: "mapping"}


def type_text(annotation: Any, metadata: list[Any] = ()) -> str:
    """A field's type in words: `int >= 1`, `list of int >= 0`, `` `a` \\| `b` ``, `... or null`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return type_text(args[0], [*inner, *metadata])
    if origin is Literal:
        return " | ".join("null" if a is None else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        shown = [type_text(a, metadata) for a in args if a is not type(None)]
        return " or ".join(shown) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    name = _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return name + (_bounds(metadata) if annotation in (int, float) else "")


def _yaml(value: Any) -> str:
    """A default as the sweep file writes it: `[fp32]`, `true`, `{}`."""
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def _default_text(info: FieldInfo, extra: dict[str, Any]) -> str:
    if "shown_default" in extra:
        return str(extra["shown_default"])
    if info.default is PydanticUndefined:
        return "required" if info.default_factory is None else ""
    if isinstance(info.default, BaseModel):
        return "(below)"
    return "null" if info.default is None else f"`{_yaml(info.default)}`"


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (`TrainSpec`, or `TargetSpec | None`), if any."""
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            return a
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        shown = str(extra.get("shown_type") or type_text(info.annotation, info.metadata))
        key = str(extra.get("shown_key") or f"{prefix}{name}")
        rows.append(
            f"| `{key}` | {_cell(shown)} | {_default_text(info, extra)} | "
            f"{_cell(info.description or _lead(_section_of(info.annotation)))} |"
        )
    for key, meaning in getattr(model, "EXTRA_KEYS", {}).items():
        rows.append(f"| `{prefix}{key}` | list | | {_cell(meaning)} |")
    return rows


def _sections(model: type[BaseModel], prefix: str) -> list[tuple[str, type[BaseModel]]]:
    """Every section under `model`, depth first: (`train.target`, TargetSpec)."""
    found = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        section = _section_of(info.annotation)
        if section is not None and not extra.get("shown_key"):
            found.append((f"{prefix}{name}", section))
            found += _sections(section, f"{prefix}{name}.")
    return found


def _lead(model: type[BaseModel] | None) -> str:
    """A section's docstring on one line: its row's meaning and its table's first line."""
    return " ".join((model.__doc__ or "").split()) if model is not None else ""


def _table(title: str, model: type[BaseModel], prefix: str) -> str:
    lead = _lead(model)
    head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    return "\n".join([f"## {title}", "", lead, "", *head, *_rows(model, prefix), ""])


def reference_markdown() -> str:
    """The whole page: the top-level keys, then one table per section."""
    parts = [_HEADER, _table("Top level", SweepSpec, "")]
    parts += [_table(f"`{path}`", model, f"{path}.") for path, model in _sections(SweepSpec, "")]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    """Print the page, or `--write` it to docs/sweep-file.md (run from the repository root)."""
    text = reference_markdown()
    if argv[1:] == ["--write"]:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
