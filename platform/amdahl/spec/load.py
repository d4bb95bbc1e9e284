"""Loading a sweep file: read it, apply `--set` overrides, validate, and say what is wrong.

`load_spec` reads the file (amdahl.spec.yaml_reader) and `validate_spec` checks a parsed mapping
against the schema (amdahl.spec.schema) and then the rules that span sections. Every problem
becomes one UserError that names the file, the line (or the `--set` that gave the value), the
dotted path, the bad value and what is allowed, with a "did you mean" for a misspelt key. Pure:
imports neither ray nor torch.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from amdahl.columns import AXES
from amdahl.errors import UserError
from amdahl.files import redact_uris, uri_passwords
from amdahl.spec.schema import SweepSpec
from amdahl.spec.yaml_reader import (
    YAML_ERRORS,
    YamlProblem,
    line_numbers,
    parse_yaml,
    yaml_error_text,
)

# --------------------------------------------------------------------------- loading


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    """Read a sweep file, apply `--set key.path=value` overrides, validate.

    Raises UserError with one message naming file, line and dotted path on any problem.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read sweep file ({e.strerror or e})") from None
    try:
        node, raw = parse_yaml(text)
        lines = line_numbers(node)
    except YamlProblem as p:
        raise UserError(f"{path}:{p.line}: {p.message}") from None
    except YAML_ERRORS as e:
        raise UserError(f"{path}: not valid YAML: {yaml_error_text(e)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a sweep file is a mapping with at least `workload:`")
    overridden: set[tuple[str | int, ...]] = set()
    for item in overrides:
        overridden.add(_apply_override(raw, item))
    spec = validate_spec(raw, source=str(path), lines=lines, overridden=overridden)
    spec._source_dir = path.resolve().parent
    spec._source_file = path.resolve()
    if spec.workload_path is not None:  # relative to the sweep file, recorded absolute
        try:
            where = (spec._source_dir / Path(spec.workload_path).expanduser()).resolve()
        except (ValueError, RuntimeError, OSError) as e:  # a NUL byte, ~unknown-user
            raise UserError(
                f"{path}: workload_path: {spec.workload_path!r} is not a usable directory "
                f"path ({e}); give a directory, absolute or relative to the sweep file"
            ) from None
        spec.workload_path = str(where)
    return spec


def validate_spec(
    raw: dict[str, Any],
    source: str = "<spec>",
    lines: dict[tuple[str | int, ...], int] | None = None,
    overridden: set[tuple[str | int, ...]] | None = None,
) -> SweepSpec:
    """Validate an already-parsed sweep mapping (the Python API's entry point)."""
    lines = lines or {}
    overridden = overridden or set()
    try:
        _check_no_passwords(raw)  # first: a refused value is never echoed or written
        _check_finite(raw)
        spec = SweepSpec.model_validate(raw)
        _check_grid_keys(spec)
        _check_cross_fields(spec)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        raise UserError(_where(source, loc, lines, overridden) + _explain(err, loc)) from None
    except _SpecProblem as p:
        raise UserError(_where(source, p.loc, lines, overridden) + p.message) from None
    return spec


class _SpecProblem(Exception):
    def __init__(self, loc: tuple[str | int, ...], message: str):
        self.loc, self.message = loc, message


def _check_no_passwords(raw: Any) -> None:
    """Refuse a password inside a URI in any string of the sweep file: spec.yaml, plan.json,
    the results' `params` column, MLflow and the report would all copy it."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    seen: set[int] = set()
    while stack:
        loc, node = stack.pop()
        if isinstance(node, str) and uri_passwords(node):
            raise _SpecProblem(loc, _password_fix(loc, node))
        if isinstance(node, dict | list) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack += [((*loc, k), v) for k, v in reversed(list(items))]


def _password_fix(loc: tuple[str | int, ...], value: str) -> str:
    shown = redact_uris(value)
    if loc == ("tracking", "uri"):
        how = (
            "give the tracking server's credentials through the environment instead: "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
        )
    elif shown.lower().startswith(("s3://", "s3a://")):
        how = (
            "leave the credentials to AWS's own chain instead: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, ~/.aws/credentials, "
            "or the node's instance role"
        )
    else:
        how = (
            "give the credentials through that service's environment variables or credential "
            "file instead (for s3:// AWS_* or ~/.aws/credentials; for gs:// "
            "GOOGLE_APPLICATION_CREDENTIALS; for the tracking server MLFLOW_TRACKING_USERNAME "
            "and MLFLOW_TRACKING_PASSWORD)"
        )
    return (
        f"holds a password inside a URI ({shown}), which would be copied into spec.yaml, "
        f"plan.json, results.parquet, MLflow and the report; drop its user:password@ part and "
        f"{how}"
    )


def _check_finite(raw: Any) -> None:
    """Refuse inf and nan anywhere in the sweep (YAML's .inf, .nan), params included: a
    learning rate, a CPU count or a workload parameter that is not a finite number would only
    fail later, inside a trial, or plan nonsense."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), raw)]
    seen: set[int] = set()
    while stack:
        loc, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise _SpecProblem(loc, f"must be a finite number, got {node!r}")
        if isinstance(node, dict | list) and id(node) not in seen:
            seen.add(id(node))
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack += [((*loc, k), v) for k, v in reversed(list(items))]


def _check_grid_keys(spec: SweepSpec) -> None:
    for key in spec.grid.model_extra or {}:
        if not key.startswith("params."):
            known = [*AXES, *(f"params.{p}" for p in spec.params)]
            raise _SpecProblem(
                ("grid", key),
                f"unknown axis {key!r}{_did_you_mean(key, known)}; "
                f"axes are {', '.join(AXES)} and params.<name>; option lists go under "
                "grid.options (options: {bucket_cap_mb: [10, 100]})",
            )
        values = spec.grid.model_extra[key]
        if not isinstance(values, list) or not values:
            raise _SpecProblem(("grid", key), f"must be a non-empty list, got {values!r}")


def _check_cross_fields(spec: SweepSpec) -> None:
    """Rules that span sections, each naming the dotted path and the bad value."""
    axes = {
        **{a: getattr(spec.grid, a) for a in AXES},
        **{f"params.{k}": v for k, v in spec.grid.param_axes().items()},
        **{f"options.{k}": v for k, v in spec.grid.option_axes().items()},
    }
    for i, entry in enumerate(spec.exclude):
        for key, value in entry.items():
            if key not in axes:
                raise _SpecProblem(
                    ("exclude", i, key), f"unknown axis {key!r}{_did_you_mean(key, list(axes))}"
                )
            if value not in axes[key]:
                raise _SpecProblem(
                    ("exclude", i, key),
                    f"{value!r} is not in grid.{key} "
                    f"{axes[key]}, so this exclusion would never match",
                )
    if spec.train.lr_warmup_steps and spec.train.lr_scaling == "none":
        raise _SpecProblem(
            ("train", "lr_warmup_steps"),
            f"ramps the rate from lr to its linearly scaled value, but train.lr_scaling is "
            f"none, so there is nothing to ramp (got {spec.train.lr_warmup_steps}); set "
            "train.lr_scaling: linear or remove lr_warmup_steps",
        )
    target = spec.train.target
    if target is not None and target.max_steps <= spec.train.warmup_steps:
        raise _SpecProblem(
            ("train", "target", "max_steps"),
            f"must exceed train.warmup_steps ({spec.train.warmup_steps}), got "
            f"{target.max_steps}: the target is checked only after warmup",
        )
    compiled = [c for c in spec.grid.compile if c != "eager"]
    if compiled and spec.train.warmup_steps == 0:
        raise _SpecProblem(
            ("train", "warmup_steps"),
            f"is 0 while grid.compile has {', '.join(compiled)}: the measured window would "
            "open before the first step, so compilation (seconds to minutes) would land in "
            "the throughput; set train.warmup_steps to 1 or more (compile_s is recorded "
            "apart either way)",
        )
    _check_strong_batches(spec)


def _check_strong_batches(spec: SweepSpec) -> None:
    """Under strong scaling the batch is global: every device count must divide it, and
    `max` (a per-device batch) has no meaning."""
    if spec.train.scaling != "strong":
        return
    if "max" in spec.grid.batch_size:
        raise _SpecProblem(
            ("grid", "batch_size"),
            "has max, which picks a per-device batch, while train.scaling is strong (a global "
            "batch); use weak scaling, or list the global batches",
        )
    for b in spec.grid.batch_size:
        for d in spec.grid.devices:
            if b % d:
                raise _SpecProblem(
                    ("grid", "batch_size"),
                    f"strong scaling splits the "
                    f"global batch {b} over {d} devices, which does not "
                    f"divide; use multiples of {d}",
                )


# --------------------------------------------------------------------------- overrides


def _apply_override(raw: dict[str, Any], item: str) -> tuple[str, ...]:
    """`train.steps=20` or `grid.devices=[1,2]`: the value is parsed as YAML."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set train.steps=20")
    try:
        _, parsed = parse_yaml(value)
    except YamlProblem as p:
        raise UserError(f"--set {item!r}: {p.message}") from None
    except YAML_ERRORS as e:
        raise UserError(f"--set {item!r}: value is not valid YAML ({yaml_error_text(e)})") from None
    parts = key.split(".")
    if parts[0] == "grid" and len(parts) == 3 and parts[1] == "params":
        parts = ["grid", f"params.{parts[2]}"]
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {item!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = parsed
    return tuple(parts)


# --------------------------------------------------------------------------- messages


def _where(source: str, loc: tuple[str | int, ...], lines: dict, overridden: set) -> str:
    dotted = _dotted(loc)
    for n in range(len(loc), 0, -1):
        if loc[:n] in overridden:
            return f"--set {_dotted(loc[:n])}: "
    for n in range(len(loc), 0, -1):
        if loc[:n] in lines:
            return f"{source}:{lines[loc[:n]]}: {dotted}: "
    return f"{source}: {dotted}: " if dotted else f"{source}: "


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(err: dict[str, Any], loc: tuple[str | int, ...]) -> str:
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        known = list(model.model_fields) if model else []
        return f"unknown key {key!r}{_did_you_mean(key, known)}; allowed keys: {', '.join(known)}"
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        return f"got {value!r}; allowed values: {ctx.get('expected')}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        bound = next(iter(ctx.values()))
        return f"must be {op} {bound}, got {value!r}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg'][0].lower()}{err['msg'][1:]}, got {value!r}"


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = SweepSpec
    for part in loc:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return None
        model = sub
    return model


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
