"""Property-based tests of sweep-file loading: whatever the YAML document and whatever the
`--set key=value` overrides, load_spec returns a validated spec or raises the one-message
UserError (exit 2 in the CLI), never another exception.

Documents are drawn three ways: mappings over the real schema's keys with random values
(dumped by PyYAML, so they parse and reach validation), those texts with YAML-significant
fragments spliced in (anchors, aliases, merges, tags, duplicate keys, unclosed brackets), and
short texts over YAML's punctuation."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from amdahl.columns import AXES
from amdahl.errors import UserError
from amdahl.spec.load import load_spec
from amdahl.spec.schema import (
    Compile,
    Input,
    Isolation,
    Precision,
    Scaling,
    SweepSpec,
    Sync,
)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _schema_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every dotted path of the real schema, nested sections included."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append((*prefix, name))
        for t in (field.annotation, *typing.get_args(field.annotation)):
            if isinstance(t, type) and issubclass(t, BaseModel):
                paths += _schema_paths(t, (*prefix, name))
    return paths


PATHS = _schema_paths(SweepSpec)
PATHS += [("grid", axis) for axis in AXES if ("grid", axis) not in PATHS]
PATHS += [("grid", "params.width"), ("params", "width"), ("params", "hidden"), ("exclude",)]
WORDS = sorted(
    {v for t in (Precision, Compile, Sync, Input, Isolation, Scaling) for v in typing.get_args(t)}
    | {"mlp", "resnet", "auto", "sgd", "adamw", "linear", "val_accuracy", "s3://b/x", "/abs"}
    | {"workloads.mlp:MLP", "inf", "nan", "-1", "1e400", "~", "null", "yes", "2024-13-01"}
    | {"~no-such-user/x", "a\x00b", "../..", "\\", "${HOME}", "%s"}
)

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(-3, 9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(WORDS),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(WORDS) | st.sampled_from(AXES) | text, inner, max_size=4)
    ),
    max_leaves=10,
)
SNIPPETS = [
    "&a ", "*a", "&a [*a]", "<<: *a\n", "<<: {x: 1}\n", "!!binary ", "!!python/object:os.system ",
    "!!set ", "!!timestamp ", "? ", "- ", ": ", "[", "]", "{", "}", "'", '"', "\t", "\n", "\n  ",
    "#", "|", ">", "%YAML 1.1\n", "---\n", "...\n", ".inf", ".nan", "-.inf", "0x1F", "1_000",
    "2001-12-14", "2024-13-45", "~", "&", "*", "!", "@", "`", ",", "\\", "\x00", "\ufeff",
]  # fmt: skip


def _set_path(doc: dict[Any, Any], path: tuple[str, ...], value: Any) -> None:
    node = doc
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[path[-1]] = value


@st.composite
def schema_documents(draw: st.DrawFn) -> str:
    doc: dict[Any, Any] = {"workload": "mlp"} if draw(st.booleans()) else {}
    for path in draw(st.lists(st.sampled_from(PATHS), max_size=6)):
        _set_path(doc, path, draw(values))
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()), sort_keys=False)


@st.composite
def spliced_documents(draw: st.DrawFn) -> str:
    body = draw(schema_documents())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(body)))
        piece = draw(st.sampled_from(SNIPPETS) | st.sampled_from(body.splitlines(True) or [""]))
        body = body[:at] + piece + body[at:]
    return body


yaml_ish = st.text(
    st.sampled_from(list("abgrid:-[]{},&*!|>?#'\"\n \t.0123456789<~%@`\\")), max_size=60
)
documents = st.one_of(schema_documents(), spliced_documents(), yaml_ish)

dotted_keys = st.one_of(
    st.sampled_from(PATHS).map(".".join),
    st.sampled_from(["grid.params.width", "params.x.y", "a..b", ".", "", "train.", "=", "x=y"]),
    text,
)
override_values = st.one_of(
    values.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
    st.sampled_from(SNIPPETS),
    yaml_ish,
)
overrides = st.lists(
    st.one_of(st.tuples(dotted_keys, override_values).map("=".join), text), max_size=4
)


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "sweep.yaml"


def _load_or_user_error(path: Path, body: str, sets: list[str]) -> None:
    path.write_text(body, encoding="utf-8")
    try:
        spec = load_spec(path, sets)
    except UserError as e:
        message = str(e)
        assert message.strip(), "a UserError must say what is wrong"
        assert "Traceback" not in message
        return
    assert isinstance(spec, SweepSpec)
    spec.model_dump_json()  # what run.py writes into spec.yaml and plan.json


@FUZZ
@given(body=documents)
def test_any_document_validates_or_is_one_user_error(sweep_file, body):
    _load_or_user_error(sweep_file, body, [])


@FUZZ
@given(body=schema_documents(), sets=overrides)
def test_any_override_validates_or_is_one_user_error(sweep_file, body, sets):
    _load_or_user_error(sweep_file, body, sets)


@FUZZ
@given(sets=overrides)
def test_overrides_on_a_good_file_validate_or_are_one_user_error(sweep_file, sets):
    _load_or_user_error(sweep_file, "name: t\nworkload: mlp\n", sets)
