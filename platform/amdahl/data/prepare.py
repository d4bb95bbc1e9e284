"""Driver-side input preparation: the Ray Datasets a sweep builds before any launch starts.

Input ray_data: the driver reads the stored parquet once into Ray's object store
(`ray_dataset`). A workload without preprocessing gets static, equal per-rank shards of those
blocks (`rank_shards`), listed enough times to cover a launch in one pass (`repeat_to_cover`);
one with preprocessing gets a `map_batches` stage with `data_workers` concurrent tasks of
`cpus_per_data_worker` CPUs (`with_preprocessing`) behind Ray Train's streaming split. What the
train workers then do with these datasets is worker/input.py's job.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from amdahl.data.storage import (
    ROWS_PER_BLOCK,
    dataset_path,
    is_uri,
    read_table,
    table_columns,
)
from amdahl.workload.api import Workload

#: Most epochs one pass of a launch's input streams (each adds a block reference per block);
#: a trial that needs more starts a new pass, at one epoch boundary's cost.
MAX_EPOCHS_PER_PASS = 64


def ray_dataset(path: str | Path, cpus_per_read_task: float) -> Any:
    """A materialised Ray Dataset of the stored rows in block-sized pieces, so that every epoch
    of every trial streams from the object store. A URI is read by Ray Data's read tasks
    (sized to the plan's data CPUs) wherever they run; a local path is read here, in the
    driver, since read tasks on other nodes cannot see this machine's disk."""
    import ray.data

    path = str(path)
    if is_uri(path):
        ds = ray.data.read_parquet(path, num_cpus=cpus_per_read_task)
        return ds.repartition(target_num_rows_per_block=ROWS_PER_BLOCK, strict=True).materialize()
    # Blocks cut here: from_arrow would ask a Ray task for the table's metadata and
    # repartition in more tasks (a worker process to start first: 0.9 s of a laptop sweep's
    # start, against 0.04 s for this). Ray serialises each slice alone, not its parent table.
    table = read_table(path)
    return ray.data.from_blocks(
        [table.slice(i, ROWS_PER_BLOCK) for i in range(0, max(1, len(table)), ROWS_PER_BLOCK)]
    )


def train_rows(workload: Workload, name: str, seed: int = 0) -> Any:
    """The training rows a sweep of `workload` (its sweep file's `workload:` reference `name`,
    its `train.seed`) read, generating them if no copy is stored: a Ray Dataset whose numpy
    batches hold the columns as `Workload.preprocess` receives them in a sweep (a column of
    two or more dimensions as a (rows, width) array). For the report's Ray Train script."""
    import ray.data

    table = read_table(dataset_path(workload, name, "train", seed))
    return ray.data.from_arrow(table).map_batches(table_columns, batch_format="pyarrow")


def rank_shards(base: Any, world: int) -> list[Any]:
    """`base` split into `world` equal, materialised shards, one per rank. Called in the
    driver before any worker group holds CPUs: splitting a block runs Ray tasks, which a
    started worker group could leave without a CPU (seen: a 2-CPU box hung)."""
    return [base] if world == 1 else base.split(world, equal=True)


def repeat_to_cover(shard: Any, rows: int) -> Any:
    """`shard`'s blocks listed enough times to stream `rows` rows in one pass (one epoch more
    than needed covers rows dropped at chunk ends). The objects are shared, not copied, and no
    task runs. Why: a new pass over a dataset costs every rank 20-120 ms here (a fresh
    iterator, and under Ray Train's streaming split a barrier across ranks), which with the
    D2L MLP's 32-step epochs was 20% of each step."""
    epochs = _epochs_per_pass(rows, shard.count())
    return shard.union(*[shard] * (epochs - 1)).materialize() if epochs > 1 else shard


def _epochs_per_pass(rows: int, rows_per_epoch: int) -> int:
    return min(MAX_EPOCHS_PER_PASS, math.ceil(rows / max(1, rows_per_epoch)) + 1)


def with_preprocessing(
    base: Any,
    workload: Workload,
    workers: int,
    cpus_per_worker: float,
    batch_size: int,
    rows_per_pass: int,
) -> Any:
    """The training input of a launch whose workload preprocesses: `base` repeated to cover
    `rows_per_pass` rows (see `repeat_to_cover`), then the workload's training preprocessing as
    a Ray Data operator with `workers` concurrent tasks of `cpus_per_worker` CPUs (the plan
    keeps those CPUs free), each task preprocessing at least one block of rows. Ray Train's
    streaming split then hands its output to the ranks, balancing as it goes."""
    import ray.data

    epochs = _epochs_per_pass(rows_per_pass, base.count())
    ds = base.union(*[base] * (epochs - 1)) if epochs > 1 else base
    ds = ds.map_batches(
        _preprocess_for_training,
        fn_kwargs={"workload": workload},
        batch_format="pyarrow",  # converted as input torch_loader converts (table_columns)
        batch_size=max(batch_size, ROWS_PER_BLOCK),
        compute=ray.data.TaskPoolStrategy(size=workers),
        num_cpus=cpus_per_worker,
    )
    # Ray Data's default allocator reserves a share of the data CPUs for every operator,
    # which on a small budget (2 CPUs minus the train workers) caps this operator below
    # `workers` concurrent tasks; the plan already keeps exactly their CPUs free.
    ds.context.op_resource_reservation_enabled = False
    callbacks = ds.context.custom_execution_callback_classes
    if IdleLoopPause not in callbacks:
        ds.context.custom_execution_callback_classes = [*callbacks, IdleLoopPause]
    return ds


class IdleLoopPause:
    """Ray Data execution callback: pause the scheduling loop when a step found nothing to do.

    In Ray 2.60 the streaming executor's loop only blocks (in `ray.wait`) while tasks run; once
    its output buffers are full because the consumer is slower (a *fed* trainer, the normal
    case) it spins, burning a whole core beside the training step: measured here, a tiny
    ResNet-18 step took 4x longer on 2 CPUs. A step shorter than `_IDLE_STEP_S` did no work;
    sleeping `_PAUSE_S` after it costs at most that much latency per completed task.
    """

    _IDLE_STEP_S = 0.0005
    _PAUSE_S = 0.002

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def before_execution_starts(self, executor: Any) -> None:
        self._last = time.perf_counter()

    def on_execution_step(self, executor: Any) -> None:
        now = time.perf_counter()
        if now - self._last < self._IDLE_STEP_S:
            time.sleep(self._PAUSE_S)
            now = time.perf_counter()
        self._last = now

    def after_execution_succeeds(self, executor: Any) -> None:
        return None

    def after_execution_fails(self, executor: Any, error: Exception) -> None:
        return None


def _preprocess_for_training(batch: pa.Table, workload: Workload) -> dict[str, np.ndarray]:
    """The workload's training preprocessing on one Arrow batch, given numpy columns exactly as
    input torch_loader gives them (`storage.table_columns`: a fixed-size-list column as a
    (rows, width) array, binary as an object array of bytes). Ray Data's own numpy batches
    would hold a multi-dimensional column as an object array of per-row arrays."""
    return workload.preprocess(table_columns(batch), training=True)
