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
from typing import Annotated, Any, Literal

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
from amdahl.spec.sections import Section
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
    profile_steps: int = Field(
        3,
        ge=0,
        le=100,
        strict=True,  # a bool is not a step count
        description="Steps of each multi-device trial recorded by torch.profiler after its "
        "measured window (per-rank Chrome traces: communication overlap, straggler rank; "
        "0: off).",
    )
    target: TargetSpec | None = Field(
        None,
        description="Time-to-target mode: train until the validation metric reaches `value` "
        "(checked every `eval_every` steps after warmup) or `max_steps` steps have run.",
    )


class GridSpec(Section):
    """Lists of values; the sweep runs their cartesian product (minus `exclude`)."""

    model_config = ConfigDict(extra="allow", validate_default=True)

    devices: list[_Positive] = Field(
        [AXIS_TABLE["devices"].default],
        min_length=1,
        description="Train workers (GPUs or CPU slots).",
    )
    batch_size: list[_Positive | Literal["max"]] = Field(
        [AXIS_TABLE["batch_size"].default],
        min_length=1,
        description="Batch size (see train.scaling). `max`: the largest power of two per "
        "device predicted to fit the device's memory (resources.device_memory_gb, or what a "
        "simulated device's workload states), resolved per configuration and printed at plan "
        "time (weak scaling only).",
    )
    precision: list[Precision] = Field(
        [AXIS_TABLE["precision"].default], min_length=1, description="Numeric precision."
    )
    compile: list[Compile] = Field(
        [AXIS_TABLE["compile"].default], min_length=1, description="Graph compilation."
    )
    data_workers: list[_NonNegative] = Field(
        [AXIS_TABLE["data_workers"].default],
        min_length=1,
        description="Concurrency of the input pipeline's preprocessing: Ray Data map tasks "
        "(input ray_data), or DataLoader workers per device (input torch_loader; 0 loads in "
        "the training process).",
    )
    input: list[Input] = Field(
        [AXIS_TABLE["input"].default],
        min_length=1,
        description="Input pipeline: ray_data (blocks in Ray's object store; with "
        "preprocessing, Ray Data map_batches and Arrow chunks through iter_batches) or "
        "torch_loader (a torch DataLoader per device), with the same preprocessing.",
    )
    prefetch_batches: list[_NonNegative] = Field(
        [AXIS_TABLE["prefetch_batches"].default],
        min_length=1,
        description="Batches each device's input prefetches ahead of the step.",
    )
    sync: list[Sync] = Field(
        [AXIS_TABLE["sync"].default], min_length=1, description="Gradient synchronisation."
    )
    accumulate_steps: list[_Positive] = Field(
        [AXIS_TABLE["accumulate_steps"].default],
        min_length=1,
        description="Micro-batches per optimizer step (gradient accumulation), with any sync "
        "but accumulate: the gradients are communicated once per step, after the last (DDP's "
        "no_sync, FSDP2's set_requires_gradient_sync); the step's samples are batch_size x "
        "this, and every step holds its gradients across the micro-batches.",
    )
    activation_checkpointing: list[Checkpointing] = Field(
        [AXIS_TABLE["activation_checkpointing"].default],
        min_length=1,
        description="Activation checkpointing over the blocks the workload names "
        "(Workload.blocks): none; full (every block keeps only its input and recomputes its "
        "forward in the backward: about a third more compute for most of the activation "
        "memory); selective (every other block: about half of each).",
    )
    options: GridOptionsSpec = Field(
        default_factory=lambda: GridOptionsSpec(),
        description="Lists of `options` values to sweep (grid.options.bucket_cap_mb: [10, "
        "100]); a value a trial does not read makes no extra trial.",
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
        description="torch.compile mode for compile=inductor (reduce-overhead uses CUDA "
        "graphs: GPU only).",
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
        description="Micro-batches per optimizer step (sync=accumulate; with any other sync, "
        "use grid.accumulate_steps).",
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
    fsdp_reshard_after_forward: bool = Field(
        OPTION_DEFAULTS["fsdp_reshard_after_forward"],
        description="sync=fsdp: free each block's gathered parameters after its forward and "
        "gather them again for backward (false keeps them: less communication, more memory).",
    )
    fsdp_param_dtype: FsdpDtype = Field(
        OPTION_DEFAULTS["fsdp_param_dtype"],
        description="sync=fsdp: dtype FSDP2 casts the gathered parameters to for compute "
        "(MixedPrecisionPolicy.param_dtype); null: the parameters' own.",
    )
    fsdp_reduce_dtype: FsdpDtype = Field(
        OPTION_DEFAULTS["fsdp_reduce_dtype"],
        description="sync=fsdp: dtype gradients are reduce-scattered in "
        "(MixedPrecisionPolicy.reduce_dtype); null: the compute dtype.",
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

    use_gpu: bool = Field(False, description="Train on GPUs (NCCL) instead of CPUs (gloo).")
    cpus_per_device: float | None = Field(
        None,
        gt=0,
        description="Ray CPUs per train worker; torch threads = max(1, floor(this)). auto "
        "(null, the default): the planner picks it so the largest trial fits (amdahl.plan).",
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
    device_memory_gb: float | None = Field(
        None,
        gt=0,
        description="Memory of one device in GB (1e9 bytes): a trial predicted to need more "
        "than 90% of it is refused at plan time, with what would fit. null (the default): no "
        "check; every trial still shows its predicted peak.",
    )
    memory_check: bool = Field(
        True,
        description="Refuse trials predicted above device_memory_gb; false runs them anyway "
        "(to see the out-of-memory error, or where the prediction is too cautious).",
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

    experiment: str | None = Field(None, description="MLflow experiment; defaults to `name`.")
    uri: str | None = Field(
        None, description="Tracking URI; MLFLOW_TRACKING_URI wins, else MLflow's default."
    )
    enabled: bool = Field(True, description="Mirror results to MLflow at all.")


class ReportSpec(Section):
    """Inputs the report needs that no measurement gives."""

    cost_per_device_hour: float = Field(
        0.0, ge=0, description="Price of one device for one hour, for cost per million samples."
    )


class SweepSpec(Section):
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
        description="Where Ray Tune and Train keep a sweep's run state (Tune's experiment, "
        "each launch's Train run; no checkpoint: the work queue and results.parquet are the "
        "record): a URI (s3://bucket/amdahl, gs://...) or an absolute path on a filesystem "
        "every node mounts (NFS, EFS); each sweep writes under <storage>/<sweep directory "
        "name>/. null: <sweep directory>/ray/ on each node's own disk, enough on any number "
        "of nodes (no node reads back what another wrote).",
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
