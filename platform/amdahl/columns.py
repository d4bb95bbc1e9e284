"""The shared vocabulary: the sweep's axes and what is known of each (`AXIS_TABLE`), one
trial's settings (`TrialSettings`, one value per axis) and the results table's columns (the
public contract of results.parquet). Imports nothing of amdahl, so spec, plan, the worker and
the report all build on it without a cycle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa


@dataclass(frozen=True, kw_only=True)
class Axis:
    """What the code around the worker knows of one axis, in one place: so that a new axis is
    its schema field, its entry in AXIS_TABLE, its TrialSettings field and the worker code that
    applies it (docs/architecture.md, "Adding an axis")."""

    #: The value of the spec's one-value default list (spec.schema.GridSpec reads it). A trial
    #: at it keeps the id it had before the axis existed (plan.trials.trial_id), and a null in a
    #: table from before the axis existed was measured under it.
    default: Any
    #: Its fragment of a configuration's label (`d2 b256 fp32 eager w1 ddp`), a format of its
    #: value (analysis.configs.config_label).
    label: str
    #: Every label names it (True); else only the labels of a sweep where some configuration
    #: leaves the default.
    always_labelled: bool = False
    #: A number: a tracked run logs it as metric `<axis>` besides param `<axis>`, so that MLflow
    #: filters and sorts it by value (track.child_run.NUMERIC_SETTINGS).
    metric: bool = False
    #: The function of report/train_snippet.py whose lines reproduce it in the Ray Train script,
    #: and what they write (tests/unit/report/test_best_config.py holds the script to it).
    snippet: str


#: The axes every sweep can vary, in order (`params.<name>` axes come on top), and their facts.
AXIS_TABLE: dict[str, Axis] = {
    "devices": Axis(
        default=1,
        label="d{}",
        always_labelled=True,
        metric=True,
        snippet="_launcher: ScalingConfig(num_workers=...)",
    ),
    "batch_size": Axis(
        default=256,
        label="b{}",
        always_labelled=True,
        metric=True,
        snippet="_input: the per-device batch_size=... of the batches",
    ),
    "precision": Axis(
        default="fp32",
        label="{}",
        always_labelled=True,
        snippet="_setup, _loop: TF32 flags, bf16 weights, autocast, fp16's GradScaler",
    ),
    "compile": Axis(
        default="eager",
        label="{}",
        always_labelled=True,
        snippet="_setup: torch.jit.script or torch.compile",
    ),
    "data_workers": Axis(
        default=1,
        label="w{}",
        always_labelled=True,
        metric=True,
        snippet="_input, _launcher: DataLoader(num_workers=...) or Ray Data's concurrency",
    ),
    "input": Axis(
        default="ray_data",
        label="{}",
        snippet="_input: iter_torch_batches or prepare_data_loader",
    ),
    "prefetch_batches": Axis(
        default=4,
        label="p{}",
        metric=True,
        snippet="_input: iter_torch_batches(prefetch_batches=...)",
    ),
    "sync": Axis(
        default="ddp",
        label="{}",
        always_labelled=True,
        snippet="_sync_setup, _loop: the strategy's wrapper, hooks and optimizer",
    ),
    "accumulate_steps": Axis(
        default=1,
        label="a{}",
        metric=True,
        snippet="_loop: micro-batches per step, no_sync / set_requires_gradient_sync on all "
        "but the last",
    ),
    "activation_checkpointing": Axis(
        default="none",
        label="ac-{}",
        snippet="_setup: apply_activation_checkpointing over the workload's blocks",
    ),
}

#: The axes every sweep can vary, in order; `params.<name>` axes come on top.
AXES = tuple(AXIS_TABLE)


def _absent(value: Any) -> bool:
    """Null in a results row: None, or NaN where pandas holds an integer column with nulls."""
    return value is None or (isinstance(value, float) and value != value)


@dataclass(frozen=True, kw_only=True)
class TrialSettings:
    """One point of a sweep's grid, typed from plan to worker: a value for every axis (the
    fields named in AXES, in that order), the workload's parameters and the options the point's
    axis values read. plan.trials.expand_grid builds it, plan.trials.Trial carries it,
    protocol.contract.TrialConfig carries it to the worker.

    The dicts are read-only by convention (plain dicts, so that they pickle and hash as JSON).
    A new axis is an entry in AXIS_TABLE and a field here (keyword-only fields, so it may sit
    among the axes)."""

    devices: int
    batch_size: int
    precision: str
    compile: str
    data_workers: int
    input: str
    prefetch_batches: int
    sync: str
    #: Defaulted, as the axes after it: settings built by hand before the axis (tests,
    #: benchmarks) leave it at its default.
    accumulate_steps: int = AXIS_TABLE["accumulate_steps"].default
    activation_checkpointing: str = AXIS_TABLE["activation_checkpointing"].default
    #: The values of the grid's `params.<name>` axes at this point (also in `params`).
    axis_params: dict[str, Any]
    #: The workload's parameters: its defaults, then the spec's, then `axis_params`.
    params: dict[str, Any]
    #: The `options` this point's axis values read (plan.trials.OPTIONS_USED_BY).
    options: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in declaration order: what plan.trials.trial_id hashes
        and plan.json shows (so both stay as they were when the settings were a dict)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(
        cls, row: Mapping[str, Any], options: Mapping[str, Any] | None = None
    ) -> TrialSettings:
        """The settings a results row (a dict, or a pandas row) was measured under: the inverse
        of protocol.identity.row_identity. The axis columns, a null (a table from before the
        axis existed) as the axis's default; the `batch_size` axis from the per-device column
        (times the devices under strong scaling); the parameters from their JSON. A row holds
        only the options away from their defaults (its `options` column) and not which
        parameters were axes: `options` are the caller's (report/best.py: the spec's with the
        column's), `axis_params` is empty."""
        axes = {
            name: axis.default if _absent(row.get(name)) else type(axis.default)(row.get(name))
            for name, axis in AXIS_TABLE.items()
        }
        if row.get("scaling") == "strong":
            axes["batch_size"] *= axes["devices"]
        params = row.get("params")
        return cls(
            **axes,
            axis_params={},
            params=json.loads(params) if isinstance(params, str) else {},
            options=dict(options or {}),
        )


#: Written into the parquet metadata; a file without it is not ours.
SCHEMA_TAG = b"amdahl.sweepdir.table.v1"

#: At most this many steps of a trial's per-step curves are kept (the `history` column).
HISTORY_POINTS = 100

#: Column -> (arrow type, meaning). The public contract of the results table.
COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "sweep": (pa.string(), "sweep name"),
    "trial_id": (pa.string(), "stable hash of the trial's settings"),
    "repeat": (pa.int64(), "repeat index, 0-based"),
    "rung": (
        pa.int64(),
        "search: halving: the rung this row measured (0 = the shortest window; `steps` says "
        "how long); null in a grid sweep",
    ),
    "launch_id": (pa.string(), "worker-group launch that ran the trial"),
    "workload": (pa.string(), "workload name"),
    "params": (pa.string(), "workload parameters as JSON"),
    "devices": (pa.int64(), "train workers"),
    "batch_size": (pa.int64(), "per-device batch size"),
    "global_batch": (pa.int64(), "samples per optimizer step over all devices (x micro-steps)"),
    "micro_steps": (pa.int64(), "forward/backward passes per optimizer step"),
    "precision": (pa.string(), "precision axis value"),
    "compile": (pa.string(), "compile axis value"),
    "compile_cache": (
        pa.string(),
        "inductor only: cold (fresh compile caches per trial), warm (shared on-disk caches), or "
        "own (a search's later rung that reloaded the graphs its configuration's first rung "
        "compiled: its compile_s is the reload's)",
    ),
    "data_workers": (pa.int64(), "input-pipeline concurrency"),
    "input": (pa.string(), "input pipeline: ray_data or torch_loader"),
    "prefetch_batches": (pa.int64(), "batches each device's input prefetches"),
    "sync": (pa.string(), "gradient synchronisation strategy"),
    "accumulate_steps": (
        pa.int64(),
        "accumulate_steps axis: micro-batches per optimizer step, communicated once (1: none; "
        "sync accumulate's own count is in micro_steps)",
    ),
    "activation_checkpointing": (
        pa.string(),
        "none, full (every block the workload names recomputes its forward in the backward) or "
        "selective (every other block)",
    ),
    "options": (
        pa.string(),
        "the `options` the trial's compile and sync values read that are away from their "
        "default, as JSON (a grid.options value, or the spec's); null: all at their default",
    ),
    "scaling": (pa.string(), "weak or strong"),
    "status": (
        pa.string(),
        "ok, failed, oom, diverged, or skipped (search: halving; the step-time model's "
        "prediction, in `error`, put it too far behind the best to measure)",
    ),
    "error": (pa.string(), "reason when status is not ok"),
    "throughput": (pa.float64(), "samples/s over all ranks, measured steps only"),
    "step_time_s": (pa.float64(), "median seconds per measured step (slowest rank)"),
    "step_time_max_s": (pa.float64(), "slowest measured step on any rank"),
    "data_wait_s": (
        pa.float64(),
        "mean seconds per step the device sat idle between steps waiting for input (on a GPU "
        "the gap between one step's end event and the next one's start, which holds a late "
        "host-to-device copy; on CPU the host's wait), median over ranks",
    ),
    "data_wait_max_s": (pa.float64(), "same, slowest rank"),
    "data_wait_host_s": (
        pa.float64(),
        "mean host seconds per step inside the input iterator (hidden on a GPU whenever the "
        "host runs ahead of the device), median over ranks",
    ),
    "transfer_s": (
        pa.float64(),
        "mean device seconds per step copying input to the GPU on a side stream, overlapped "
        "with the previous step's compute (GPU only), median over ranks",
    ),
    "forward_s": (pa.float64(), "mean seconds per step in forward + loss, median over ranks"),
    "backward_s": (
        pa.float64(),
        "mean seconds per step in backward (includes DDP's exposed all-reduce), median over ranks",
    ),
    "optimizer_s": (
        pa.float64(),
        "mean seconds per step in the optimizer step and sync "
        "strategy's step hooks, median over ranks",
    ),
    "measured_s": (pa.float64(), "seconds inside measured steps (slowest rank)"),
    "warmup_s": (pa.float64(), "seconds spent in warmup steps (includes first-step compile)"),
    "first_step_s": (
        pa.float64(),
        "seconds of the first warmup step (lazy compilation lands here)",
    ),
    "compile_s": (
        pa.float64(),
        "seconds in torch.jit.script / torch.compile wrapping plus the first step's compute in "
        "excess of a steady step (its wait for input left out: first_step_s holds both)",
    ),
    "setup_s": (pa.float64(), "seconds from trial start on the workers to its first step"),
    "wall_s": (pa.float64(), "seconds from trial start to its results row"),
    "launch_entered_unix_s": (
        pa.float64(),
        "first row of a launch only: Unix time its workers' training function began (against "
        "the driver's clock: how long Ray took to start the worker group)",
    ),
    "launch_setup_s": (
        pa.float64(),
        "first row of a launch only: seconds the workers spent before its first trial "
        "(validation rows, peak-FLOP/s probe, starting the input pipeline)",
    ),
    "steps": (
        pa.int64(),
        "measured steps (after warmup; in time-to-target mode, those run until the target)",
    ),
    "warmup_steps": (pa.int64(), "warmup steps"),
    "lr": (pa.float64(), "learning rate after warmup (scaled when train.lr_scaling is linear)"),
    "target": (pa.string(), "time-to-target goal, e.g. val_accuracy>=0.9 (null: fixed steps)"),
    "steps_to_target": (
        pa.int64(),
        "optimizer steps (warmup included) until validation first met the target; "
        "null if never within max_steps",
    ),
    "time_to_target_s": (
        pa.float64(),
        "seconds from the first step to those steps' end, validation passes excluded "
        "(slowest rank)",
    ),
    "final_loss": (pa.float64(), "training loss of the last step, mean over ranks"),
    "val_loss": (pa.float64(), "validation loss at the end (rank 0's model)"),
    "val_accuracy": (pa.float64(), "validation accuracy at the end, when the workload has one"),
    "peak_mem_bytes": (
        pa.float64(),
        "peak tensor bytes a rank held during a training step, the figure a device must hold: "
        "on a GPU torch.cuda.max_memory_allocated over the trial above its baseline; on CPU the "
        "tensor ledger's peak over one untimed step after the window (every storage alive: "
        "parameters, gradients, optimizer state, activations, temporaries, module buffers, DDP's "
        "gradient buckets); null for an inductor trial on CPU, whose generated code allocates "
        "where the ledger cannot see; max over ranks",
    ),
    "predicted_peak_mem_bytes": (
        pa.float64(),
        "peak_mem_bytes as the plan predicted it before the trial ran (analysis.memory_model "
        "over the memory probe's facts); null where the probe could not run",
    ),
    "model_state_bytes": (
        pa.float64(),
        "parameter + optimizer-state bytes one rank holds, "
        "counted from its tensors (what zero1/fsdp shard); max over ranks",
    ),
    "peak_mem_reserved_bytes": (pa.float64(), "CUDA max reserved (GPU only), max over ranks"),
    "peak_rss_bytes": (
        pa.float64(),
        "CPU only: peak resident memory of the rank's process during the trial above its "
        "pre-trial baseline (allocator caches, arenas and the input pipeline's buffers besides "
        "the tensors: about twice peak_mem_bytes on a small transformer); max over ranks",
    ),
    **{
        f"mem_{part}_bytes": (
            pa.float64(),
            f"{meaning} alive at the tensor ledger's peak, on the rank with the largest "
            "peak_mem_bytes (the six mem_*_bytes add up to its ledger's peak); null for an "
            "inductor trial",
        )
        for part, meaning in (
            ("parameters", "parameter bytes (this rank's shard under fsdp)"),
            ("gradients", "gradient bytes"),
            ("optimizer", "optimizer-state bytes (this rank's partition under zero1/fsdp)"),
            ("activations", "bytes the forward allocated (saved activations, cast inputs)"),
            ("temporaries", "bytes the backward and optimizer step allocated, gradients apart"),
            ("other", "module buffers and a sync strategy's own buffers (DDP's buckets)"),
        )
    },
    "comm_s": (
        pa.float64(),
        "exposed gradient communication per step: forward+backward with "
        "DDP's all-reduce minus under no_sync, from interleaved calibration passes after "
        "the measured window; median over ranks; null where not estimable and at one "
        "device (no collective)",
    ),
    "profile_s": (
        pa.float64(),
        "seconds of the profiler pass (train.profile_steps traced steps after the measured "
        "window, trace export and compression included; slowest rank); null when not run",
    ),
    "comm_trace_s": (
        pa.float64(),
        "communication seconds per step in the profiler traces (the union of the NCCL kernels, "
        "or of gloo's collectives on CPU), median over ranks",
    ),
    "comm_overlap": (
        pa.float64(),
        "share of that communication time during which computation ran too (HTA's "
        "communication/computation overlap), median over ranks; 1 = wholly hidden",
    ),
    "straggler_rank": (
        pa.int64(),
        "the rank the others wait for: least exposed communication per step in the traces",
    ),
    "straggler_s": (
        pa.float64(),
        "seconds per step the other ranks wait for the straggler (median of their exposed "
        "communication minus its own)",
    ),
    "trace_dir": (
        pa.string(),
        "folder of the trial's per-rank Chrome traces (rank<k>.pt.trace.json.gz), relative to "
        "the sweep directory",
    ),
    "flops_per_sample": (
        pa.float64(),
        "training FLOPs per sample behind achieved_flops and mfu: the one flops_source names "
        "(rows before flops_source: the workload's stated figure)",
    ),
    "flops_source": (
        pa.string(),
        "counted (flops_counted) or stated (flops_stated: the workload's flops_override, or "
        "nothing counted); null where neither exists",
    ),
    "flops_counted": (
        pa.float64(),
        "the model's FLOPs per sample of one training step's forward, loss and backward on the "
        "plain model and one of the trial's batches, counted by torch's FlopCounterMode (rank 0); "
        "the fused attention backward's recomputation left out (PaLM's model FLOPs)",
    ),
    "flops_hardware": (
        pa.float64(),
        "flops_counted with the fused attention backward's recomputed scores: the FLOPs the "
        "kernels execute (HFU's numerator); equal to flops_counted where nothing is recomputed",
    ),
    "flops_stated": (pa.float64(), "FLOPs per sample the workload states (flops_per_sample())"),
    "flops_count_s": (
        pa.float64(),
        "seconds rank 0 spent counting flops_counted, after the measured window (0: counted "
        "for an earlier trial of the launch with the same model)",
    ),
    "achieved_flops": (pa.float64(), "FLOP/s over all ranks"),
    "peak_flops": (
        pa.float64(),
        "measured matmul FLOP/s of one worker at the trial's compute "
        "dtype (a measurement, not a datasheet peak), or the peak a workload states for the "
        "device it simulates (Workload.peak_flops); median over ranks",
    ),
    "mfu": (pa.float64(), "achieved_flops / (peak_flops x devices): model FLOPs utilisation"),
    "hfu": (
        pa.float64(),
        "hardware FLOPs utilisation: throughput x flops_hardware / (peak_flops x devices); "
        "null where it equals mfu (nothing recomputed) or MFU uses the stated figure",
    ),
    "cpu_utilisation": (
        pa.float64(),
        "percent of its allowed cores a rank's process kept busy over the measured window "
        "(CPU seconds / wall seconds / cores); median over ranks",
    ),
    "host_cores": (
        pa.int64(),
        "cores rank 0's process may run on (its affinity mask): what cpu_utilisation is a "
        "percentage of, and the node capacity the step-time model's contention term starts from",
    ),
    "gpu_utilisation": (
        pa.float64(),
        "percent of the measured window NVML saw a kernel running on the rank's GPU (GPU "
        "only, null without NVML); median over ranks",
    ),
    "device_name": (pa.string(), "cpu or the GPU's name"),
    "backend": (pa.string(), "torch.distributed backend"),
    "torch_threads": (pa.int64(), "intra-op threads per worker"),
    "host": (pa.string(), "hostname of rank 0"),
    "nodes": (pa.string(), "Ray node id of each rank, in rank order, as JSON"),
    "versions": (pa.string(), "library versions as JSON"),
    "started_at": (pa.string(), "UTC ISO time the trial started, to the millisecond"),
    "comm_probe_s": (
        pa.float64(),
        "seconds the exposed-communication estimate (comm_s) took after the window, slowest "
        "rank (null on a ranking rung, which skips it)",
    ),
    "validation_s": (
        pa.float64(),
        "seconds the validation pass took after the window, slowest rank (null on a ranking rung)",
    ),
    "handover_s": (
        pa.float64(),
        "seconds rank 0 spent between its previous answer (or its set-up) and this item's "
        "start: waiting for the item, its broadcast, the trial world's entry, the previous "
        "trial's garbage collection and, for a launch's first trial of a device count, its "
        "input's set-up",
    ),
    "window_opened_unix": (
        pa.float64(),
        "Unix time rank 0's measured window opened (after set-up and warmup), stamped by the "
        "worker: the closing summary's first measured step is the earliest, minus the start",
    ),
    "item_measured_s": (
        pa.float64(),
        "seconds of measured window this item ran, slowest rank: measured_s, except where the "
        "row continues a kept trial (windows > 1), whose measured_s pools every window; with "
        "it, wall_s and window_opened_unix, a continued row's set-up and warmup columns (the "
        "first item's) are not this item's seconds",
    ),
    "windows": (
        pa.int64(),
        "measured windows this row's figures pool: 1, or more where search: halving continued "
        "a configuration kept from its earlier rungs (its steps, step times and window seconds "
        "are every window's; set-up, warmup, compile, first-step and memory figures the first "
        "item's; utilisation the last window's)",
    ),
    "continued_from": (
        pa.string(),
        "halving: the item (trial_id/repeat/rung) whose kept trial this row continued; null "
        "where it started fresh",
    ),
    "restart_reason": (
        pa.string(),
        "halving: why a configuration promoted from the rung before started fresh instead of "
        "continuing (not kept: over the memory budget, a restarted worker group, a compiled "
        "or parameter-server configuration, which is never kept, ...)",
    ),
    "history": (
        pa.string(),
        "per-step training curves of rank 0, as JSON: `step` (the optimizer step, 1-based, "
        "warmup included), `loss` (its training loss), `step_time_s` and `data_wait_s` (its "
        "seconds from start to end, and of input wait before it, measured as the columns of "
        "those names), `elapsed_s` (seconds from the first step's input wait to this step's "
        "end, on the step clock; absent before it was recorded), lists of equal length, null "
        "where not finite; at most "
        f"{HISTORY_POINTS} steps, evenly spaced, the first and last always among them; null "
        "for a failed trial",
    ),
    "utilisation": (
        pa.string(),
        "every rank's utilisation samples over the measured window, as JSON: a list in rank "
        "order of {`t` (seconds since the window opened), `cpu_percent`, and on a GPU "
        "`gpu_percent` and `gpu_mib` (memory torch holds)}; MLflow shows them as system "
        "metrics",
    ),
}

#: Columns copied straight from a trial's settings: the sweep axes besides batch size (whose
#: column holds the per-device batch, which under strong scaling is not the axis value).
SETTING_COLUMNS = tuple(axis for axis in AXES if axis != "batch_size")

SCHEMA = pa.schema([pa.field(k, t) for k, (t, _) in COLUMNS.items()]).with_metadata(
    {b"amdahl": SCHEMA_TAG}
)


def per_device_batch(batch: int, devices: int, scaling: str) -> float:
    """The batch one device takes for the `batch_size` axis value `batch`: the value itself
    under weak scaling; under strong scaling the global batch split over `devices` (a fraction
    where it does not divide: the spec refuses that for a sweep, a prediction may ask it)."""
    return batch / devices if scaling == "strong" else batch


def history_steps(count: int, limit: int = HISTORY_POINTS) -> list[int]:
    """Which of `count` steps (0-based) the `history` column keeps: all of them up to `limit`,
    else `limit` evenly spaced ones, the first and last among them."""
    if count <= limit:
        return list(range(count))
    if limit < 2:
        return [count - 1] if limit == 1 else []
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})
