"""The results table: one row per trial repeat in `<sweep dir>/results.parquet`.

It is the source of truth (MLflow is a mirror, the report a view). The driver is its only writer
and replaces the file atomically after every row, so a crash never damages earlier rows.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from amdahl.errors import UserError
from amdahl.files import write_private
from amdahl.spec.schema import AXES, TargetSpec
from amdahl.sweepdir.layout import RESULTS_FILE

if TYPE_CHECKING:
    from amdahl.worker.contract import LaunchConfig, TrialConfig

#: The single key under which a worker reports a row as JSON (Tune adds keys of its own,
#: `trial_id` among them, to every reported result).
ROW_KEY = "amdahl_row"
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
        "inductor only: cold (fresh compile caches per trial) or warm (shared on-disk caches)",
    ),
    "data_workers": (pa.int64(), "input-pipeline concurrency"),
    "input": (pa.string(), "input pipeline: ray_data or torch_loader"),
    "prefetch_batches": (pa.int64(), "batches each device's input prefetches"),
    "sync": (pa.string(), "gradient synchronisation strategy"),
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
        "seconds in torch.jit.script / torch.compile wrapping plus the "
        "first step's excess over a steady step",
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
        "peak memory during the trial above the pre-trial baseline: CUDA max allocated, or "
        "on CPU peak resident memory; max over ranks",
    ),
    "model_state_bytes": (
        pa.float64(),
        "parameter + optimizer-state bytes one rank holds, "
        "counted from its tensors (what zero1/fsdp shard); max over ranks",
    ),
    "peak_mem_reserved_bytes": (pa.float64(), "CUDA max reserved (GPU only), max over ranks"),
    "comm_s": (
        pa.float64(),
        "exposed gradient communication per step: forward+backward with "
        "DDP's all-reduce minus under no_sync, from interleaved calibration passes after "
        "the measured window; median over ranks; null where not estimable",
    ),
    "flops_per_sample": (pa.float64(), "training FLOPs per sample stated by the workload"),
    "achieved_flops": (pa.float64(), "FLOP/s over all ranks"),
    "peak_flops": (
        pa.float64(),
        "measured matmul FLOP/s of one worker at the trial's compute "
        "dtype (a measurement, not a datasheet peak); median over ranks",
    ),
    "mfu": (pa.float64(), "achieved_flops / (peak_flops x devices)"),
    "device_name": (pa.string(), "cpu or the GPU's name"),
    "backend": (pa.string(), "torch.distributed backend"),
    "torch_threads": (pa.int64(), "intra-op threads per worker"),
    "host": (pa.string(), "hostname of rank 0"),
    "nodes": (pa.string(), "Ray node id of each rank, in rank order, as JSON"),
    "versions": (pa.string(), "library versions as JSON"),
    "started_at": (pa.string(), "UTC ISO time the trial started"),
    "history": (
        pa.string(),
        "per-step training curves of rank 0, as JSON: `step` (the optimizer step, 1-based, "
        "warmup included), `loss` (its training loss), `step_time_s` and `data_wait_s` (its "
        "seconds from start to end, and of input wait before it, measured as the columns of "
        "those names), lists of equal length, null where not finite; at most "
        f"{HISTORY_POINTS} steps, evenly spaced, the first and last always among them; null "
        "for a failed trial",
    ),
}

#: Columns copied straight from a trial's settings: the sweep axes besides batch size (whose
#: column holds the per-device batch, which under strong scaling is not the axis value).
SETTING_COLUMNS = tuple(axis for axis in AXES if axis != "batch_size")

SCHEMA = pa.schema([pa.field(k, t) for k, (t, _) in COLUMNS.items()]).with_metadata(
    {b"amdahl": SCHEMA_TAG}
)


def history_steps(count: int, limit: int = HISTORY_POINTS) -> list[int]:
    """Which of `count` steps (0-based) the `history` column keeps: all of them up to `limit`,
    else `limit` evenly spaced ones, the first and last among them."""
    if count <= limit:
        return list(range(count))
    if limit < 2:
        return [count - 1] if limit == 1 else []
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def row_identity(
    launch: LaunchConfig, trial: TrialConfig, repeat: int, started_at: str | None = None
) -> dict[str, Any]:
    """The columns that say which measurement a row is (what was run, and how), the same in
    every row the worker measures and every failed row the driver records for it."""
    train = launch.train
    return {
        "sweep": launch.sweep,
        "trial_id": trial.trial_id,
        "repeat": repeat,
        "rung": launch.rung,
        "launch_id": launch.launch_id,
        "workload": launch.workload,
        "params": json.dumps(trial.params, sort_keys=True),
        **{k: getattr(trial, k) for k in SETTING_COLUMNS},
        "batch_size": trial.per_device_batch,
        "compile_cache": trial.compile_cache,
        "scaling": train.scaling,
        "steps": train.steps,
        "target": target_label(train.target),
        "warmup_steps": train.warmup_steps,
        "started_at": started_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def row_key(row: dict[str, Any]) -> tuple[str, int, int | None]:
    """What makes a row unique: a later row with the same key replaces it (a retried trial)."""
    return row["trial_id"], row["repeat"], row.get("rung")


def target_label(target: TargetSpec | None) -> str | None:
    """`train.target` as the results table shows it, e.g. `val_accuracy>=0.9`."""
    if target is None:
        return None
    op = "<=" if target.metric == "val_loss" else ">="
    return f"{target.metric}{op}{target.value:g}"


_OOM_REASON = re.compile(r"(launch failed: \S*RankStranded: )?oom: ")


def failure_status(reason: str) -> str:
    """The status of a row whose trial failed with `reason`: `oom` when a rank ran out of
    memory (also when it reached the driver as a stopped worker group's last error line,
    e.g. `launch failed: RankStranded: oom: rank 1: ...`), else `failed`."""
    return "oom" if _OOM_REASON.match(reason) else "failed"


def read_results(sweep_dir: str | Path) -> pa.Table:
    """The sweep's rows; a missing file is an empty table, a foreign or broken one a UserError."""
    path = Path(sweep_dir) / RESULTS_FILE
    if not Path(sweep_dir).is_dir():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (expected a folder holding "
            f"{RESULTS_FILE}, as written by `platform sweep`)"
        )
    if not path.exists():
        return SCHEMA.empty_table()
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(
            f"{path}: not a readable parquet file ({e}); restore it or start a new sweep directory"
        ) from None
    if (table.schema.metadata or {}).get(b"amdahl") != SCHEMA_TAG:
        raise UserError(f"{path}: not an amdahl results table (no {SCHEMA_TAG.decode()} tag)")
    return _conform(table, path)


def append_rows(sweep_dir: str | Path, rows: list[dict[str, Any]]) -> pa.Table:
    """Add rows and atomically replace results.parquet; returns the whole new table.

    A row replaces an earlier one with the same `row_key`: a retried trial has one row.
    """
    path = Path(sweep_dir) / RESULTS_FILE
    old = read_results(sweep_dir)
    keys = {row_key(r) for r in rows}
    if keys and old.num_rows:
        columns = zip(*(old[k].to_pylist() for k in ("trial_id", "repeat", "rung")), strict=True)
        kept = [key not in keys for key in columns]
        old = old.filter(pa.array(kept))
    new = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows], schema=SCHEMA)
    table = pa.concat_tables([old, new]).replace_schema_metadata(SCHEMA.metadata)
    # Owner-only (the params column holds configuration), through a temporary file no other
    # process writes: a fixed name would let two writers replace each other's half-written file.
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    write_private(path, buffer.getvalue().to_pybytes())
    return table


def _conform(table: pa.Table, path: str | Path = RESULTS_FILE) -> pa.Table:
    """Old sweeps stay readable: add columns they lack as nulls, keep the known order.

    A column that is there twice, or whose values do not convert to its type (a damaged or
    hand-edited file), is a UserError naming `path` and the column."""
    arrays = []
    for name, (typ, _) in COLUMNS.items():
        found = table.schema.get_all_field_indices(name)
        if len(found) > 1:
            raise UserError(
                f"{path}: column {name!r} appears {len(found)} times; not a results table "
                "amdahl wrote: restore it or start a new sweep directory"
            )
        if not found:
            arrays.append(pa.nulls(len(table), typ))
            continue
        column = table.column(found[0])
        try:
            conformed = column.cast(typ)
            conformed.validate(full=True)  # e.g. bytes that are not UTF-8 in a string column
        except (pa.ArrowException, ValueError, TypeError) as e:
            raise UserError(
                f"{path}: column {name!r} ({column.type}) does not hold valid {typ} values "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); the file is "
                "damaged or not amdahl's: restore it or start a new sweep directory"
            ) from None
        arrays.append(conformed)
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
