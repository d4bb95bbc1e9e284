"""Sweep files: load, override, validate.

One typed model per YAML section (torchtitan style), extra keys forbidden, and every error turned
into one message that names the file, the line, the dotted path, the bad value and what is allowed.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from amdahl.columns import AXES, COLUMNS
from amdahl.errors import UserError
from amdahl.files import redact_uris, uri_passwords
from amdahl.strategies import NAMES, OPTION_DEFAULTS

Precision = Literal["fp32", "tf32", "bf16", "fp16", "bf16_weights"]
Compile = Literal["eager", "inductor", "torchscript"]
#: The sync strategies, from their table (strategies.py); pydantic lists them in its error.
Sync = Literal[NAMES]
Input = Literal["ray_data", "torch_loader"]
Isolation = Literal["exclusive", "shared"]
Scaling = Literal["weak", "strong"]
_Positive = Annotated[int, Field(ge=1)]
_NonNegative = Annotated[int, Field(ge=0)]
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.")


class _Section(BaseModel):
    # allow_inf_nan=False: "inf" and "nan" (strings pydantic would turn into floats) are refused
    # like YAML's .inf and .nan (see _check_finite): no count, rate or price is infinite.
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


class TargetSpec(_Section):
    """Time-to-target mode (MLPerf style): how long until validation quality reaches a value."""

    metric: Literal["val_accuracy", "val_loss"] = Field(
        description="Validation metric: val_accuracy is reached at >= value, val_loss at <= value."
    )
    value: float = Field(description="The target value of `metric`.")
    max_steps: int = Field(
        ge=1, description="Most optimizer steps a trial runs (warmup included) before giving up."
    )
    eval_every: int = Field(
        50, ge=1, description="Optimizer steps between validation passes (after warmup)."
    )


class TrainSpec(_Section):
    """How each trial trains and what is timed."""

    steps: int = Field(50, ge=1, description="Measured optimizer steps per trial (after warmup).")
    warmup_steps: int = Field(
        10, ge=0, description="Steps run first and excluded from timing (allocator, caches)."
    )
    repeats: int = Field(
        1, ge=1, description="Times each trial is measured; each repeat is its own results row."
    )
    seed: int = Field(0, description="Seed for model initialisation and synthetic data.")
    lr: float = Field(0.05, gt=0, description="Learning rate.")
    optimizer: Literal["sgd", "adamw"] = Field(
        "sgd",
        description="sgd (momentum 0.9) or adamw; both keep per-parameter state, which "
        "is what zero1 and fsdp shard.",
    )
    scaling: Scaling = Field(
        "weak",
        description="weak: batch_size is per device (global batch grows with devices); "
        "strong: batch_size is the global batch, split across devices.",
    )
    max_failures: int = Field(
        0,
        ge=0,
        description="Times a launch is restarted after a worker dies before its "
        "unfinished trials are recorded as failed.",
    )
    lr_scaling: Literal["none", "linear"] = Field(
        "none",
        description="linear: lr x effective batch / lr_base_batch (Goyal et al. 2017), where "
        "the effective batch is devices x per-device batch x micro-steps.",
    )
    lr_base_batch: int = Field(
        256, ge=1, description="Effective batch at which `lr` is right (lr_scaling linear)."
    )
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="Optimizer steps over which the learning rate ramps linearly from `lr` to "
        "its scaled value (gradual warmup; counted from the trial's first step).",
    )
    target: TargetSpec | None = Field(
        None,
        description="Time-to-target mode: train until the validation metric reaches `value` "
        "(checked every `eval_every` steps after warmup) or `max_steps` steps have run.",
    )


class GridSpec(_Section):
    """Lists of values; the sweep runs their cartesian product (minus `exclude`)."""

    model_config = ConfigDict(extra="allow", validate_default=True)

    devices: list[_Positive] = Field(
        [1], min_length=1, description="Train workers (GPUs or CPU slots)."
    )
    batch_size: list[_Positive] = Field(
        [256], min_length=1, description="Batch size (see train.scaling)."
    )
    precision: list[Precision] = Field(["fp32"], min_length=1, description="Numeric precision.")
    compile: list[Compile] = Field(["eager"], min_length=1, description="Graph compilation.")
    data_workers: list[_Positive] = Field(
        [1],
        min_length=1,
        description="Concurrency of the input pipeline's preprocessing: Ray Data map tasks "
        "(input ray_data), or DataLoader workers per device (input torch_loader).",
    )
    input: list[Input] = Field(
        ["ray_data"],
        min_length=1,
        description="Input pipeline: ray_data (Ray Data map_batches + iter_torch_batches) or "
        "torch_loader (a torch DataLoader per device), with the same preprocessing.",
    )
    prefetch_batches: list[_NonNegative] = Field(
        [4], min_length=1, description="Batches each device's input prefetches ahead of the step."
    )
    sync: list[Sync] = Field(["ddp"], min_length=1, description="Gradient synchronisation.")

    def param_axes(self) -> dict[str, list[Any]]:
        """The `params.<name>` axes, keyed by parameter name."""
        return {k.removeprefix("params."): v for k, v in (self.model_extra or {}).items()}


class OptionsSpec(_Section):
    """Settings of individual axis values (each applies only where its axis value is used)."""

    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = Field(
        "default", description="torch.compile mode for compile=inductor."
    )
    compile_cache: Literal["cold", "warm"] = Field(
        "cold",
        description="compile=inductor: cold gives every trial empty inductor/Triton caches, so "
        "compile_s counts every compilation; warm reuses the on-disk caches of earlier trials "
        "and runs (what a user's second run pays).",
    )
    bucket_cap_mb: float = Field(
        OPTION_DEFAULTS["bucket_cap_mb"], gt=0, description="DDP gradient bucket size (ddp*)."
    )
    powersgd_rank: int = Field(
        OPTION_DEFAULTS["powersgd_rank"], ge=1, description="PowerSGD matrix rank (sync=powersgd)."
    )
    accumulate_steps: int = Field(
        OPTION_DEFAULTS["accumulate_steps"],
        ge=1,
        description="Micro-batches per optimizer step (sync=accumulate).",
    )
    local_sgd_every: int = Field(
        OPTION_DEFAULTS["local_sgd_every"],
        ge=1,
        description="Steps between parameter averages (sync=local_sgd).",
    )
    ps_shards: int = Field(
        OPTION_DEFAULTS["ps_shards"],
        ge=1,
        description="Parameter-server actors (sync=param_server).",
    )


class ResourcesSpec(_Section):
    """What each trial asks Ray for."""

    use_gpu: bool = Field(False, description="Train on GPUs (NCCL) instead of CPUs (gloo).")
    cpus_per_device: float | None = Field(
        None,
        gt=0,
        description="Ray CPUs per train worker; torch threads = max(1, floor(this)). auto "
        "(null, the default): the planner picks it so the largest trial fits (plan.py).",
    )
    gpus_per_device: float = Field(
        1.0, gt=0, description="Ray GPUs per train worker (use_gpu); at most 1, and 1 for d > 1."
    )
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description="pack: train workers on as few nodes as possible (fast intra-node "
        "links); spread: one per node where possible (Ray Train's placement strategy).",
    )
    cpus_per_data_worker: float | None = Field(
        None,
        gt=0,
        description="Ray CPUs kept free for each input-pipeline worker. auto (null, the "
        "default): the planner picks it with cpus_per_device.",
    )

    @field_validator("cpus_per_device", "cpus_per_data_worker", mode="before")
    @classmethod
    def _auto_is_none(cls, value: Any) -> Any:
        if value == "auto":
            return None
        if isinstance(value, str):
            raise ValueError(f"got {value!r}: give a number of CPUs > 0, or auto")
        return value


class TrackingSpec(_Section):
    """Where results are mirrored in MLflow."""

    experiment: str | None = Field(None, description="MLflow experiment; defaults to `name`.")
    uri: str | None = Field(
        None, description="Tracking URI; MLFLOW_TRACKING_URI wins, else MLflow's default."
    )
    enabled: bool = Field(True, description="Mirror results to MLflow at all.")


class ReportSpec(_Section):
    """Inputs the report needs that no measurement gives."""

    cost_per_device_hour: float = Field(
        0.0, ge=0, description="Price of one device for one hour, for cost per million samples."
    )


Objective = Literal["throughput", "throughput_per_device", "time_to_target"]
_CONSTRAINT = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")
_BUDGET = re.compile(r"^\s*([0-9.]+)\s*(%|s)?\s*$")


class SearchSpec(_Section):
    """How the grid's configurations are searched (search.py, docs/architecture.md "Search")."""

    method: Literal["grid", "halving"] = Field(
        "grid",
        description="grid: measure every configuration for train.steps; halving: successive "
        "halving, short windows for all, longer ones for the best 1/eta of each rung.",
    )
    budget: float | str | None = Field(
        None,
        description="halving: most trial-seconds to spend, as seconds (600 or '600s') or as a "
        "share of the whole grid's estimated trial-seconds ('25%'); null: no limit.",
    )
    eta: int = Field(3, ge=2, description="halving: keep the best 1/eta of each rung.")
    min_steps: int = Field(
        10, ge=1, description="halving: measured steps of the first rung (x eta per rung)."
    )
    final_repeats: int = Field(
        1,
        ge=1,
        description="halving: measurements of each finalist in the last rung, interleaved in "
        "one launch; the final ranking is their median, and the finalists whose spread cannot "
        "be told apart from the best are named as such.",
    )
    objective: Objective = Field(
        "throughput",
        description="What is best: throughput (samples/s), throughput_per_device (samples/s "
        "per device: throughput per device-hour), or time_to_target (train.target needed).",
    )
    constraints: list[str] = Field(
        [],
        description="Conditions on a row's columns a configuration must meet, such as "
        "'peak_mem_bytes <= 4e9' or 'val_accuracy >= 0.8' (<=, >=, <, >).",
    )
    skip_below: float | None = Field(
        0.5,
        gt=0,
        le=1,
        description="halving: skip a configuration the step-time model predicts below this "
        "share of the best measured objective (recorded as status skipped); null: never.",
    )
    calibration: str | None = Field(
        None,
        description="halving: a calibration.json (`platform calibrate`) giving the step-time "
        "model its communication terms, or 'auto': measure it in the sweep's own Ray before the "
        "first rung (into the sweep directory; about 20 s on a laptop). Without one the model "
        "predicts sync none families only.",
    )

    @field_validator("budget")
    @classmethod
    def _budget_seconds_or_share(cls, value: float | str | None) -> float | str | None:
        if value is None:
            return None
        m = _BUDGET.match(str(value))
        if not m or float(m.group(1)) <= 0 or (m.group(2) == "%" and float(m.group(1)) > 100):
            raise ValueError(
                f"got {value!r}: give trial-seconds (600 or '600s') or a share of the grid's "
                "estimated cost ('25%', at most 100%)"
            )
        return value

    @field_validator("constraints")
    @classmethod
    def _constraints_parse(cls, value: list[str]) -> list[str]:
        if not value:
            return value

        for text in value:
            m = _CONSTRAINT.match(text)
            if not m:
                raise ValueError(
                    f"got {text!r}: write COLUMN OP NUMBER, e.g. 'peak_mem_bytes <= 4e9' "
                    "(OP one of <=, >=, <, >)"
                )
            column = m.group(1)
            if column not in COLUMNS or not _numeric_column(COLUMNS[column][0]):
                numeric = sorted(k for k, (t, _) in COLUMNS.items() if _numeric_column(t))
                raise ValueError(
                    f"{text!r}: {column!r} is not a numeric results column; one of "
                    + ", ".join(numeric)
                )
        return value

    def budget_s(self, grid_estimate_s: float) -> float | None:
        """The budget in trial-seconds, given the whole grid's estimated trial-seconds."""
        if self.budget is None:
            return None
        m = _BUDGET.match(str(self.budget))
        assert m is not None  # validated
        number = float(m.group(1))
        return number / 100 * grid_estimate_s if m.group(2) == "%" else number


def _numeric_column(typ: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(typ) or pa.types.is_floating(typ)


class SweepSpec(_Section):
    """A whole sweep file."""

    name: str = Field("sweep", pattern=r"^[A-Za-z0-9_.-]+$", description="Sweep name.")
    workload: str = Field(description="Registered workload (`mlp`) or `package.module:Class`.")
    params: dict[str, Any] = Field({}, description="Keyword arguments for the workload.")
    train: TrainSpec = TrainSpec()
    grid: GridSpec = GridSpec()
    options: OptionsSpec = OptionsSpec()
    exclude: list[dict[str, Any]] = Field(
        [], description="Partial settings; a trial matching every key of one entry is skipped."
    )
    resources: ResourcesSpec = Field(
        ResourcesSpec(),
        description="auto (the default) or a mapping; every field left out or auto is "
        "chosen by the planner to fit the machine or cluster.",
    )
    workload_path: str | None = Field(
        None,
        description="A directory holding the workload's code, searched before the sweep "
        "file's directory and the working directory (relative: to the sweep file); the "
        "workload's top-level package is shipped from there to every Ray worker.",
    )
    isolation: Isolation = Field(
        "exclusive",
        description="exclusive: one launch at a time (honest timing); shared: "
        "launches run side by side when resources allow.",
    )
    search: SearchSpec = SearchSpec()
    tracking: TrackingSpec = TrackingSpec()
    report: ReportSpec = ReportSpec()
    storage: str | None = Field(
        None,
        description="Where Ray keeps a sweep's run state (Tune's experiment, rank 0's "
        "checkpoint of finished trials): a URI (s3://bucket/amdahl, gs://...) or an absolute "
        "path on a filesystem every node mounts (NFS, EFS); each sweep writes under "
        "<storage>/<sweep directory name>/. null: the sweep directory, on the driver's disk, "
        "which a plan spanning several nodes refuses.",
    )

    #: The sweep file's directory (load_spec), searched for the workload's code.
    _source_dir: Path | None = PrivateAttr(None)

    @field_validator("resources", mode="before")
    @classmethod
    def _resources_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"got {value!r}: give auto, or a mapping such as {{use_gpu: true}}")
        return {} if value in ("auto", None) else value

    @field_validator("storage")
    @classmethod
    def _storage_is_uri_or_absolute(cls, value: str | None) -> str | None:
        if value is None or _URI.match(value) or value.startswith("/"):
            return value
        raise ValueError(
            f"got {value!r}: give a URI such as s3://bucket/amdahl, or an absolute path on a "
            "filesystem every node mounts (NFS, EFS); a relative path would differ per process"
        )

    @property
    def source_dir(self) -> Path | None:
        """The sweep file's directory (load_spec), None for a spec built in Python."""
        return self._source_dir

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name


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
        node, raw = _parse_yaml(text)
        lines = _line_numbers(node)
    except _YamlProblem as p:
        raise UserError(f"{path}:{p.line}: {p.message}") from None
    except _YAML_ERRORS as e:
        raise UserError(f"{path}: not valid YAML: {_yaml_error(e)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a sweep file is a mapping with at least `workload:`")
    overridden: set[tuple[str | int, ...]] = set()
    for item in overrides:
        overridden.add(_apply_override(raw, item))
    spec = validate_spec(raw, source=str(path), lines=lines, overridden=overridden)
    spec._source_dir = path.resolve().parent
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
                f"axes are {', '.join(AXES)} and params.<name>",
            )
        values = spec.grid.model_extra[key]
        if not isinstance(values, list) or not values:
            raise _SpecProblem(("grid", key), f"must be a non-empty list, got {values!r}")


def _check_cross_fields(spec: SweepSpec) -> None:
    """Rules that span sections, each naming the dotted path and the bad value."""
    axes = {
        **{a: getattr(spec.grid, a) for a in AXES},
        **{f"params.{k}": v for k, v in spec.grid.param_axes().items()},
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
    if spec.train.scaling == "strong":
        for b in spec.grid.batch_size:
            for d in spec.grid.devices:
                if b % d:
                    raise _SpecProblem(
                        ("grid", "batch_size"),
                        f"strong scaling splits the "
                        f"global batch {b} over {d} devices, which does not "
                        f"divide; use multiples of {d}",
                    )


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


#: What parsing a YAML text can raise besides _YamlProblem: PyYAML's own errors, ValueError for
#: a date such as 2024-13-01, RecursionError for nesting deeper than Python's stack.
_YAML_ERRORS = (yaml.YAMLError, ValueError, OverflowError, RecursionError)
#: Most nodes a document may expand to through its aliases ("billion laughs" documents).
_MAX_YAML_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _YamlProblem(yaml.YAMLError):
    """A YAML document PyYAML accepts but a sweep file must not be: `line` is 1-based."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


class _SweepLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping. YAML requires unique
    keys, but PyYAML keeps the last one silently, so a second `grid:` replaced the first.
    Keys that a `<<` merge brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader refuses it itself
                if first is not None:
                    raise _YamlProblem(
                        line,
                        f"duplicate key {key!r} (first on line {first}); a key may appear "
                        "only once in a mapping: merge the two into one",
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and its Python value, through _SweepLoader, after refusing
    recursive and exponentially expanding aliases (_check_aliases)."""
    loader = _SweepLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_aliases(node)
        try:
            return node, loader.construct_document(node)
        except yaml.YAMLError:
            raise
        except Exception as e:  # PyYAML's constructors fail raw on some explicit tags
            raise yaml.YAMLError(  # (`!!timestamp ''`: AttributeError; `!!int x`: ValueError)
                f"cannot build a value ({type(e).__name__}: {e}); quote it if it is text, or "
                "fix its explicit !!tag"
            ) from None
    finally:
        loader.dispose()


def _check_aliases(root: yaml.Node) -> None:
    """An alias names a node, so a node holding an alias of itself (`a: &x [*x]`) is a cycle,
    which gave a RecursionError traceback; and aliases of aliases can expand a short file to
    billions of nodes. Both are refused, naming the line."""
    count = 0
    ancestors: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, True)]
    while stack:
        node, entering = stack.pop()
        if not entering:
            ancestors.discard(id(node))
            continue
        line = node.start_mark.line + 1
        if id(node) in ancestors:
            raise _YamlProblem(
                line,
                "this node contains an alias of itself (a recursive anchor); an alias "
                "(*name) may only repeat a node defined before and outside it",
            )
        count += 1
        if count > _MAX_YAML_NODES:
            raise _YamlProblem(
                line,
                f"the document's aliases expand to over {_MAX_YAML_NODES:,} values; a sweep "
                "file is far smaller: repeat fewer aliases",
            )
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            continue
        ancestors.add(id(node))
        stack.append((node, False))
        stack += [(child, True) for child in reversed(children)]


def _yaml_error(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)


def _line_numbers(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
    """Map each dotted path in the YAML document to its 1-based line number."""
    out: dict[tuple[str | int, ...], int] = {}

    def walk(n: yaml.Node, path: tuple[str | int, ...]) -> None:
        out[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                walk(v, (*path, k.value))
                out[(*path, k.value)] = k.start_mark.line + 1  # the key's line, not the value's
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, (*path, i))

    if node is not None:
        walk(node, ())
    return out


def _apply_override(raw: dict[str, Any], item: str) -> tuple[str, ...]:
    """`train.steps=20` or `grid.devices=[1,2]`: the value is parsed as YAML."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UserError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set train.steps=20")
    try:
        _, parsed = _parse_yaml(value)
    except _YamlProblem as p:
        raise UserError(f"--set {item!r}: {p.message}") from None
    except _YAML_ERRORS as e:
        raise UserError(f"--set {item!r}: value is not valid YAML ({_yaml_error(e)})") from None
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
