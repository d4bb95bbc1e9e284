"""The sweep file's schema: one typed pydantic model per YAML section, and their Literal types.

One model per section (torchtitan style), extra keys forbidden, each field's default and meaning
in its description. Only the rules a single section can check live here; reading the file,
the rules that span sections and the error messages are amdahl.spec.load's. The worker imports
its train section (TrainSpec, TargetSpec) from here, so this module stays light: pydantic and
amdahl's base only. Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    create_model,
    field_validator,
    model_serializer,
)
from pydantic.fields import FieldInfo

from amdahl.columns import AXIS_TABLE
from amdahl.spec.search_section import SearchSpec
from amdahl.spec.section_base import Section
from amdahl.strategies import NAMES, OPTION_DEFAULTS

Precision = Literal["fp32", "tf32", "bf16", "fp16", "bf16_weights"]
Compile = Literal["eager", "inductor", "torchscript"]
#: The sync strategies, from their table (strategies.py); pydantic lists them in its error.
Sync = Literal[NAMES]
Input = Literal["ray_data", "torch_loader"]
Checkpointing = Literal["none", "full", "selective"]
Isolation = Literal["exclusive", "shared"]
Scaling = Literal["weak", "strong"]
#: A dtype of FSDP2's MixedPrecisionPolicy; null leaves the field unset (FSDP2's default).
FsdpDtype = Literal[None, "fp32", "bf16", "fp16"]
_Positive = Annotated[int, Field(ge=1)]
_NonNegative = Annotated[int, Field(ge=0)]
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://.")


class TargetSpec(Section):
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


class TrainSpec(Section):
    """How each trial trains and what is timed."""

    steps: int = Field(50, ge=1, description="measured optimizer steps per trial.")
    warmup_steps: int = Field(10, ge=0, description="steps run first and excluded from timing.")
    repeats: int = Field(
        1,
        ge=1,
        description="measurements per trial; each repeat is its own row, and a launch runs "
        "repeat 0 of all its trials before repeat 1 of any, so a drift of the machine falls "
        "on every configuration alike; the report says when repeats differ by a CV over 10% "
        "over windows under 1 s (too short to rank on: raise `train.steps`).",
    )
    seed: int = Field(0, description="seed for model initialisation and synthetic data.")
    lr: float = Field(0.05, gt=0, description="learning rate.")
    optimizer: Literal["sgd", "adamw"] = Field(
        "sgd",
        description="SGD with momentum 0.9, or AdamW.",
    )
    scaling: Scaling = Field(
        "weak",
        description="weak: `batch_size` is per device; strong: `batch_size` is the global "
        "batch split over devices (must divide).",
    )
    max_failures: int = Field(
        0,
        ge=0,
        description="restarts of a launch whose worker died.",
    )
    lr_scaling: Literal["none", "linear"] = Field(
        "none",
        description="linear: the rate is `lr` x effective batch / `lr_base_batch` "
        "(effective batch = devices x per-device batch x micro-steps; Goyal et al. 2017); the"
        " row's `lr` column shows the rate used.",
    )
    lr_base_batch: int = Field(256, ge=1, description="effective batch at which `lr` is right.")
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="optimizer steps over which the rate ramps linearly from `lr` to its "
        "scaled value (needs `lr_scaling: linear`).",
    )
    profile_steps: int = Field(
        3,
        ge=0,
        le=100,
        strict=True,  # a bool is not a step count
        description="steps of each multi-device trial traced by torch.profiler after its "
        "measured window (overlap, straggler, per-rank traces); 0: off; a resume may change "
        "it.",
    )
    target: TargetSpec | None = Field(
        None,
        description="time-to-target mode, e.g. `{metric: val_accuracy, value: 0.9, "
        "max_steps: 2000, eval_every: 50}`: train until the validation metric reaches `value`"
        " (`val_accuracy` >=, `val_loss` <=), checked every `eval_every` (default 50) steps "
        "after warmup, or until `max_steps` steps (warmup included); `train.steps` is then "
        "unused.",
    )


class GridSpec(Section):
    """Lists of values; the sweep runs their cartesian product (minus `exclude`)."""

    model_config = ConfigDict(extra="allow", validate_default=True)
    #: The keys beyond the fields (extra="allow"), with their meaning: docs/sweep-file.md's rows.
    EXTRA_KEYS: ClassVar[dict[str, str]] = {
        "params.<name>": "sweep a workload parameter: a list of values of `params.<name>`, "
        "crossed with the axes (`grid: {params.hidden: [[256], [1024, 1024]]}`).",
    }

    devices: list[_Positive] = Field(
        [AXIS_TABLE["devices"].default],
        min_length=1,
        description="train workers (GPUs, or CPU slots).",
    )
    batch_size: list[_Positive | Literal["max"]] = Field(
        [AXIS_TABLE["batch_size"].default],
        min_length=1,
        description="batch size (see `train.scaling`); `max`: the largest power of two per "
        "device predicted to fit the device's memory (`resources.device_memory_gb`), resolved"
        " per device count, precision and sync and printed by `platform plan` (weak scaling "
        "only).",
    )
    precision: list[Precision] = Field(
        [AXIS_TABLE["precision"].default],
        min_length=1,
        description="`tf32` needs CUDA; `bf16`/`fp16` are autocast (`fp16` with a "
        "GradScaler); `bf16_weights` keeps model and optimizer in bf16.",
    )
    compile: list[Compile] = Field(
        [AXIS_TABLE["compile"].default],
        min_length=1,
        description="graph compilation (`options.compile_mode` for inductor).",
    )
    data_workers: list[_NonNegative] = Field(
        [AXIS_TABLE["data_workers"].default],
        min_length=1,
        description="preprocessing concurrency: Ray Data map tasks shared by all devices "
        "(`ray_data`, at least 1), or DataLoader workers on each device (`torch_loader`; 0 "
        "makes the batches in the training process, no worker processes, and its time shows "
        "as data wait: on 2 cores the MLP at one device ran at 0.98 of a plain loop on Ray "
        "with 0, 0.75 with 1, `benchmarks/harness_overhead.py`); each keeps "
        "`resources.cpus_per_data_worker` CPUs free.",
    )
    input: list[Input] = Field(
        [AXIS_TABLE["input"].default],
        min_length=1,
        description="input pipeline, with the same preprocessing: Ray Data (blocks in the "
        "object store; `map_batches` and Arrow chunks through `iter_batches` when "
        "preprocessing) or a torch DataLoader per device.",
    )
    prefetch_batches: list[_NonNegative] = Field(
        [AXIS_TABLE["prefetch_batches"].default],
        min_length=1,
        description="batches each device's input prefetches ahead of the step (DataLoader: "
        "`prefetch_factor` = ceil(this / `data_workers`), at least 1; a ray_data shard "
        "without preprocessing on CPU is memory the device already holds: no effect).",
    )
    sync: list[Sync] = Field(
        [AXIS_TABLE["sync"].default],
        min_length=1,
        description="gradient synchronisation; `none` = every worker trains alone (the no-"
        "communication ceiling); what a device or a combination cannot do is refused at plan "
        "time, with the reason.",
    )
    accumulate_steps: list[_Positive] = Field(
        [AXIS_TABLE["accumulate_steps"].default],
        min_length=1,
        description="gradient accumulation with any `sync` (but `accumulate`, its older "
        "form): this many micro-batches of `batch_size` per optimizer step, their gradients "
        "communicated once after the last (`no_sync`, FSDP2's `set_requires_gradient_sync`), "
        "which divides the communication per sample by it and costs a full gradient held per "
        "rank across the micro-batches (unsharded under fsdp); throughput and `global_batch` "
        "count every micro-batch.",
    )
    activation_checkpointing: list[Checkpointing] = Field(
        [AXIS_TABLE["activation_checkpointing"].default],
        min_length=1,
        description="recompute the forward of the blocks the workload names "
        "(`Workload.blocks`) in the backward instead of keeping their activations: `full` "
        "every block, `selective` every other one; costs up to one more forward of those "
        "blocks (counted in HFU's hardware FLOPs, not in MFU's), saves most of their "
        "activation memory (the memory probe measures both lines); refused for a workload "
        "that names no blocks and with `torchscript`.",
    )
    options: GridOptionsSpec = Field(
        default_factory=lambda: GridOptionsSpec(),
        description="sweep an option (any `options.*`, each value checked as that option is), "
        "crossed with the axes, e.g. `options: {bucket_cap_mb: [10, 25, 100]}`; a value a trial "
        "does not read (a bucket size under `fsdp`, a mode under `eager`) makes no extra trial: "
        "`platform plan` says how many it dropped; each swept value costs one trial per "
        "configuration that reads it, and labels name it (`ddp bucket100`); `exclude` may name "
        "`options.<name>`.",
        json_schema_extra={
            "shown_key": "grid.options.<name>",
            "shown_type": "list of that option's values",
        },
    )

    def param_axes(self) -> dict[str, list[Any]]:
        """The `params.<name>` axes, keyed by parameter name."""
        return {k.removeprefix("params."): v for k, v in (self.model_extra or {}).items()}

    def option_axes(self) -> dict[str, list[Any]]:
        """The `options.<name>` lists, keyed by option name, in OptionsSpec's order."""
        return self.options.model_dump()


class OptionsSpec(Section):
    """Settings of individual axis values (each applies only where its axis value is used)."""

    compile_mode: Literal[
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = Field(
        "default",
        description="torch.compile mode for `inductor`: the max-autotune modes search "
        "kernel configurations (minutes of compile time, in `compile_s`, for possibly faster "
        "steps); `reduce-overhead` records CUDA graphs (less launch overhead, more memory) "
        "and is refused on a CPU sweep.",
    )
    compile_cache: Literal["cold", "warm"] = Field(
        "cold",
        description="`cold`: each inductor trial compiles into empty caches (in a halving "
        "search, a configuration's later rungs load what its first rung compiled, from caches"
        " of its own: inductor generates its code once per configuration, and such a row says"
        " `own`); `warm`: shared on-disk caches.",
    )
    bucket_cap_mb: float = Field(
        OPTION_DEFAULTS["bucket_cap_mb"], gt=0, description="DDP bucket size."
    )
    powersgd_rank: int = Field(OPTION_DEFAULTS["powersgd_rank"], ge=1, description="PowerSGD rank.")
    accumulate_steps: int = Field(
        OPTION_DEFAULTS["accumulate_steps"],
        ge=1,
        description="micro-batches per step for `accumulate` (the older spelling of "
        "`grid.accumulate_steps` with `sync: ddp`, kept so old sweep files run with their "
        "ids; the plan says so).",
    )
    local_sgd_every: int = Field(
        OPTION_DEFAULTS["local_sgd_every"],
        ge=1,
        description="steps between averages for `local_sgd`.",
    )
    ps_shards: int = Field(
        OPTION_DEFAULTS["ps_shards"],
        ge=1,
        description="parameter-server actors for `param_server`.",
    )
    fsdp_reshard_after_forward: bool = Field(
        OPTION_DEFAULTS["fsdp_reshard_after_forward"],
        description="`fsdp`: free each block's gathered parameters after its forward and "
        "gather them again for backward; `false` keeps them (one all-gather per block fewer "
        "each step, the whole model's parameters held from forward to backward).",
    )
    fsdp_param_dtype: FsdpDtype = Field(
        OPTION_DEFAULTS["fsdp_param_dtype"],
        description="`fsdp`: FSDP2's `MixedPrecisionPolicy.param_dtype`, the dtype "
        "parameters are gathered and computed in (bf16/fp16: half the all-gather bytes and "
        "faster matmuls on a GPU, lower precision); null: the parameters' own.",
    )
    fsdp_reduce_dtype: FsdpDtype = Field(
        OPTION_DEFAULTS["fsdp_reduce_dtype"],
        description="`fsdp`: `MixedPrecisionPolicy.reduce_dtype`, the dtype gradients are "
        "reduce-scattered in (bf16/fp16 halve those bytes, at some gradient precision); null:"
        " the compute dtype.",
    )


def options_column(options: dict[str, Any]) -> str | None:
    """The results' `options` column for a trial's options (TrialSettings.options): those away
    from their default, as JSON, or null, so that the rows of every trial at the defaults read
    as rows did before the column existed."""
    fields = OptionsSpec.model_fields
    moved = {k: v for k, v in options.items() if k not in fields or v != fields[k].default}
    return json.dumps(moved, sort_keys=True) if moved else None


def _distinct(values: list[Any]) -> list[Any]:
    """A list of option values with no value twice (a repeat would plan one trial twice)."""
    for i, v in enumerate(values):
        if v in values[:i]:
            raise ValueError(f"lists {v!r} twice; give each value once")
    return values


def _checked_as(info: FieldInfo) -> Any:
    """A field's type with its constraints (ge, gt, ...), to check one list item by."""
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


class _OptionLists(Section):
    @model_serializer(mode="wrap")
    def _listed_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only the options swept: spec.yaml and best.yaml say `options: {}` for none."""
        return {k: v for k, v in handler(self).items() if v is not None}


#: `grid.options`: each field of OptionsSpec as an optional non-empty list, each value checked
#: exactly as OptionsSpec checks that field (its type and bounds), unknown names refused.
GridOptionsSpec = create_model(
    "GridOptionsSpec",
    __base__=_OptionLists,
    __doc__="Option lists: the sweep crosses each with the axes (grid.options.<name>).",
    **{
        name: (
            Annotated[
                list[_checked_as(info)] | None,
                AfterValidator(lambda v: v if v is None else _distinct(v)),
            ],
            Field(None, min_length=1, description=f"Values of options.{name} to sweep."),
        )
        for name, info in OptionsSpec.model_fields.items()
    },
)
GridSpec.model_rebuild()  # its `options` field, made above from OptionsSpec


class ResourcesSpec(Section):
    """What each trial asks Ray for."""

    use_gpu: bool = Field(False, description="GPUs with NCCL instead of CPUs with gloo.")
    cpus_per_device: float | None = Field(
        None,
        gt=0,
        description="Ray CPUs per train worker; torch threads = max(1, floor(this)). auto "
        "on CPU: 1, or less so that the largest trial (its train workers, input workers and "
        "the trial driver) fits the machine or cluster, down to 0.25 (trials that would need "
        "less are refused with the arithmetic); with `use_gpu`: the GPU node's CPUs less 1 "
        "(or the largest trial's input CPUs) for Ray, divided among its GPUs, whole CPUs from"
        " 1 up.",
        json_schema_extra={"shown_type": "float > 0 or `auto`", "shown_default": "`auto`"},
    )
    gpus_per_device: float = Field(
        1.0,
        gt=0,
        description="Ray GPUs per train worker; each worker drives one GPU, so more than 1 "
        "is refused, and less than 1 only for single-device trials (two workers on one GPU "
        "make NCCL fail).",
    )
    placement: Literal["pack", "spread"] = Field(
        "pack",
        description="pack: train workers on as few nodes as possible (fast intra-node "
        "links); spread: one per node where possible (Ray Train's placement strategy).",
    )
    cpus_per_data_worker: float | None = Field(
        None,
        gt=0,
        description="Ray CPUs kept free per input worker; auto: 0.5, shrunk in proportion "
        "with `cpus_per_device` on CPU.",
        json_schema_extra={"shown_type": "float > 0 or `auto`", "shown_default": "`auto`"},
    )
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        description="one device's memory in GB (1e9 bytes): a trial whose predicted peak "
        "tensor bytes per device exceed 90% of it is refused at plan time with what would fit"
        " (a per-device batch limit, `zero1` / `fsdp`), and `platform plan` prints the "
        "largest per-device batch that fits each configuration; null: no check (each trial "
        "still shows its predicted peak).",
    )
    memory_check: bool = Field(
        True,
        description="false runs the trials predicted not to fit anyway (to see the OOM, or "
        "where the prediction is too cautious).",
    )

    @field_validator("cpus_per_device", "cpus_per_data_worker", mode="before")
    @classmethod
    def _auto_is_none(cls, value: Any) -> Any:
        if value == "auto":
            return None
        if isinstance(value, str):
            raise ValueError(f"got {value!r}: give a number of CPUs > 0, or auto")
        return value


class TrackingSpec(Section):
    """Where results are mirrored in MLflow."""

    experiment: str | None = Field(
        None,
        description="MLflow experiment.",
        json_schema_extra={"shown_default": "`name`"},
    )
    uri: str | None = Field(
        None,
        description="tracking URI, without a password; `MLFLOW_TRACKING_URI` wins.",
        json_schema_extra={"shown_default": "MLflow's default"},
    )
    enabled: bool = Field(True, description="mirror to MLflow at all (`--no-tracking` too).")


class ReportSpec(Section):
    """Inputs the report needs that no measurement gives."""

    cost_per_device_hour: float = Field(
        0.0, ge=0, description="price of a device-hour, for cost per million samples."
    )


class SweepSpec(Section):
    """A whole sweep file."""

    name: str = Field(
        "sweep",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="sweep name; directory prefix and default MLflow experiment.",
        json_schema_extra={"shown_type": "string `[A-Za-z0-9_.-]+`"},
    )
    workload: str = Field(
        description="a registered name (`mlp`, `gpt`, `resnet`, `simulated`) or "
        "`package.module:Class` (a `amdahl.Workload` subclass; see [Your own "
        "workload](workload.md))."
    )
    params: dict[str, Any] = Field(
        {},
        description="keyword arguments of the workload (`mlp`: `inputs` 512, `hidden` [256,"
        " 128], `classes` 2, `train_rows` 16384, `val_rows` 2048; `resnet`: `width` 64, "
        "`classes` 10, `augment` `none`|`light`|`heavy` (light), `augment_ops` 2, `dataset` "
        "`synthetic`|`digits`, `train_rows` 8192, `val_rows` 1024; `simulated`: see [Scale "
        "without the devices](workload.md#scale-without-the-devices)); every workload also "
        "takes `data`: a directory or URI holding `train/` and `val/` parquet to use instead "
        "of generated rows (see [Input pipeline](data.md)).",
    )
    train: TrainSpec = TrainSpec()
    grid: GridSpec = GridSpec()
    options: OptionsSpec = OptionsSpec()
    exclude: list[dict[str, Any]] = Field(
        [],
        description="skip every trial matching all keys of one entry, e.g. `- {devices: 1, "
        "sync: none}`.",
        json_schema_extra={"shown_type": "list of partial settings"},
    )
    resources: ResourcesSpec = Field(
        ResourcesSpec(),
        description="every field below left out (or `auto`) is chosen by the planner; "
        "`platform plan` and `platform sweep` print what it chose.",
        json_schema_extra={"shown_type": "`auto` or mapping", "shown_default": "`auto`"},
    )
    workload_path: str | None = Field(
        None,
        description="where your workload's code lives when it is neither beside the sweep "
        "file nor in the working directory (relative: to the sweep file); searched first, and"
        " the workload's package is shipped from there to every Ray worker.",
        json_schema_extra={"shown_type": "directory or null"},
    )
    isolation: Isolation = Field(
        "exclusive",
        description="exclusive: one launch at a time (honest timing); shared: launches side"
        " by side.",
    )
    search: SearchSpec = SearchSpec()
    tracking: TrackingSpec = TrackingSpec()
    report: ReportSpec = ReportSpec()
    storage: str | None = Field(
        None,
        description="where Ray Tune and Train keep their run state, under `<storage>/<sweep"
        " directory name>/`: `s3://bucket/amdahl`, `gs://...`, or a filesystem every node "
        "mounts. null: the sweep directory, on each node's own disk, which is enough on any "
        "number of nodes (no checkpoint is read back across nodes: the driver's work queue "
        "and results.parquet are the record).",
        json_schema_extra={"shown_type": "URI or absolute path, or null"},
    )

    #: The sweep file's directory (load_spec), searched for the workload's code.
    _source_dir: Path | None = PrivateAttr(None)
    #: The sweep file itself (load_spec), which the MLflow mirror names as the runs' source.
    _source_file: Path | None = PrivateAttr(None)

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
    def source_file(self) -> Path | None:
        """The sweep file (load_spec), None for a spec built in Python."""
        return self._source_file

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name
