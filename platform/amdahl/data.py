"""The input pipeline: rows stored as parquet, preprocessed and fed to each train worker.

Storage. Generated rows are written once per (workload, the parameters that decide them, split,
seed) into a cache directory and reused by every trial and sweep that asks for the same data; a
user's own parquet (`params.data`, a local path or any URI pyarrow and Ray Data read) is used in
place. `platform data fashion-mnist --from DIR` converts Fashion-MNIST's IDX files to that layout.

Two inputs (the `input` axis), the same preprocessing (`Workload.preprocess`) in both:
- ray_data: the sweep driver reads the parquet once into the object store; each launch adds a
  `map_batches` stage with `data_workers` concurrent tasks of `cpus_per_data_worker` CPUs, and each
  rank streams its split through `iter_torch_batches` with `prefetch_batches` (pinned memory and
  device transfer on GPU);
- torch_loader: each rank reads its own slice of the parquet into a torch DataLoader with
  `num_workers = data_workers`, pinned memory on GPU and persistent workers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from amdahl.errors import UserError
from amdahl.workload import Workload

if TYPE_CHECKING:
    import torch

#: Where generated datasets live; AMDAHL_DATA_DIR overrides.
DEFAULT_CACHE = Path(os.environ.get("AMDAHL_DATA_DIR", Path.home() / ".cache" / "amdahl" / "data"))
_ROWS_PER_FILE = 4096
#: Rows per block of the materialised dataset, and the fewest rows one preprocessing task
#: handles. Each Ray Data task and block costs ~15 ms of scheduling and object-store traffic
#: here whatever its work (256-row tasks capped a 2-CPU box at ~17k rows/s), so tasks must be
#: large: with RandAugment-style images, 512-row tasks fed 0.6x of a DataLoader's rows/s,
#: 2048-row tasks 0.9x. The price is latency: an epoch's first batch waits for a whole task.
_ROWS_PER_BLOCK = 2048
_VAL_CHUNK = 4096


# --------------------------------------------------------------------------- storage


def stored_dataset(
    workload: Workload, name: str, split: str, seed: int, cache: Path = DEFAULT_CACHE
) -> Path:
    """Directory of parquet shards for this workload's split; generated on first use only.

    Keyed by the parameters that decide the rows (`Workload.data_params`), so sweeping a model
    width or an augmentation reuses the same files.
    """
    key = hashlib.sha1(
        json.dumps([name, workload.data_key(), split, seed], sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    out = cache / f"{name}-{split}-{key}"
    if not (out / "_COMPLETE").exists():
        _write_parquet_dir(workload.generate(split, workload.rows(split), seed), out)
    return out


def dataset_path(
    workload: Workload, name: str, split: str, seed: int, cache: Path = DEFAULT_CACHE
) -> str:
    """Where `split` is read from: the user's `params.data`/<split>, else the generated copy."""
    source = workload.source(split)
    if source is None:
        return str(stored_dataset(workload, name, split, seed, cache))
    return resolve_source(source)


def resolve_source(source: str) -> str:
    """A URI as given; a local path made absolute (workers run elsewhere) and checked."""
    if "://" in source:
        return source
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise UserError(
            f"params.data: {path} does not exist; point params.data at a directory holding "
            "train/ and val/ parquet (`platform data fashion-mnist --from DIR` writes one)"
        )
    return str(path)


def check_source(workload: Workload) -> None:
    """Fail before anything launches when `params.data` names a local path that is missing."""
    for split in ("train", "val"):
        source = workload.source(split)
        if source is not None:
            resolve_source(source)


def _write_parquet_dir(columns: dict[str, np.ndarray], out: Path) -> None:
    """Columns -> `out/part-*.parquet` + `_COMPLETE`, written aside and renamed into place."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    table = pa.table({k: _arrow_column(v) for k, v in columns.items()})
    for i, start in enumerate(range(0, max(len(table), 1), _ROWS_PER_FILE)):
        pq.write_table(table.slice(start, _ROWS_PER_FILE), tmp / f"part-{i:05d}.parquet")
    (tmp / "_COMPLETE").touch()
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


def _arrow_column(values: np.ndarray) -> pa.Array:
    """1-D columns as plain arrays (bytes as binary), 2-D+ as fixed-size lists (Ray Data reads
    them as tensors)."""
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, int(np.prod(values.shape[1:])))


def read_rows(path: str) -> dict[str, np.ndarray]:
    """A parquet file or directory (path or URI) as numpy columns."""
    import pyarrow.dataset as pads

    return table_columns(pads.dataset(path, format="parquet").to_table())


def table_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """Arrow -> numpy the way Ray Data's numpy batches look: binary as an object array of
    bytes, fixed-size lists as (rows, width) arrays."""
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table[name].combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            flat = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def validation_rows(workload: Workload, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The held-out split, preprocessed for evaluation (no augmentation)."""
    path = config.get("val_path")
    rows = (
        read_rows(path) if path else workload.generate("val", workload.rows("val"), config["seed"])
    )
    if not workload.preprocesses:
        return rows
    n = len(next(iter(rows.values())))
    chunks = [
        workload.preprocess({k: v[i : i + _VAL_CHUNK] for k, v in rows.items()}, training=False)
        for i in range(0, n, _VAL_CHUNK)
    ]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


# --------------------------------------------------------------------------- Fashion-MNIST

#: Fashion-MNIST's files (the names of its official distribution), per split we store.
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (the MNIST format, gzipped or not): magic = 0, 0, dtype code, ndim; then
    ndim big-endian uint32 sizes; then the data, big-endian, row-major."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise UserError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != math.prod(dims):
        raise UserError(f"{path}: header says {dims} but the file holds {data.size} values")
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def convert_fashion_mnist(src: str | Path, out: str | Path) -> Path:
    """Fashion-MNIST's four IDX files in `src` -> `out/train/` and `out/val/` parquet
    (`image`: 784 raw uint8 bytes, 28x28 row-major; `label`: int64), the layout `params.data`
    reads. The 10,000 t10k rows become the validation split."""
    src, out = Path(src), Path(out)
    for split, (images_name, labels_name) in FASHION_MNIST_FILES.items():
        images = read_idx(_find(src, images_name))
        labels = read_idx(_find(src, labels_name))
        if images.ndim != 3 or len(images) != len(labels):
            raise UserError(
                f"{src}: {images_name} holds {images.shape} and {labels_name} "
                f"{labels.shape}; expected (n, rows, cols) images and n labels"
            )
        flat = np.ascontiguousarray(images, dtype=np.uint8).reshape(len(images), -1)
        encoded = np.empty(len(flat), dtype=object)
        encoded[:] = [row.tobytes() for row in flat]
        target = out / split
        shutil.rmtree(target, ignore_errors=True)
        _write_parquet_dir({"image": encoded, "label": labels.astype(np.int64)}, target)
    return out


def _find(src: Path, name: str) -> Path:
    for candidate in (src / f"{name}.gz", src / name):
        if candidate.exists():
            return candidate
    raise UserError(
        f"{src}: no {name}.gz (or {name}); download Fashion-MNIST's four IDX files "
        "(github.com/zalandoresearch/fashion-mnist) into this directory"
    )


# --------------------------------------------------------------------------- ray_data input


def ray_dataset(path: str | Path, cpus_per_read_task: float) -> Any:
    """A materialised Ray Dataset of the stored rows in small blocks (read tasks sized to the
    plan's data CPUs), so that every epoch of every trial streams from memory."""
    import ray.data

    ds = ray.data.read_parquet(str(path), num_cpus=cpus_per_read_task)
    return ds.repartition(target_num_rows_per_block=_ROWS_PER_BLOCK, strict=True).materialize()


def preprocessed(
    base: Any, workload: Workload, workers: int, cpus_per_worker: float, batch_size: int
) -> Any:
    """`base` followed by the workload's training preprocessing as a Ray Data operator with
    `workers` concurrent tasks of `cpus_per_worker` CPUs (the plan keeps those CPUs free), each
    task preprocessing at least one block of rows at once."""
    import ray.data

    ds = base
    if workload.preprocesses:
        ds = base.map_batches(
            _preprocess_for_training,
            fn_kwargs={"workload": workload},
            batch_format="numpy",
            batch_size=max(batch_size, _ROWS_PER_BLOCK),
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


def _preprocess_for_training(
    batch: dict[str, np.ndarray], workload: Workload
) -> dict[str, np.ndarray]:
    return workload.preprocess(batch, training=True)


# --------------------------------------------------------------------------- torch_loader input


@dataclass
class LoaderSource:
    """What one rank's torch DataLoader reads: its slice of the stored parquet."""

    path: str
    workload: Workload
    rank: int
    world: int
    workers: int
    _table: pa.Table | None = field(default=None, repr=False)

    def table(self) -> pa.Table:
        """This rank's rows (read once per launch): every world-th file when there are enough
        files, else every world-th row."""
        if self._table is None:
            import pyarrow.dataset as pads

            try:
                ds = pads.dataset(self.path, format="parquet")
            except (FileNotFoundError, pa.ArrowInvalid) as e:
                raise RuntimeError(
                    f"input torch_loader reads {self.path} on every node, which failed ({e}); "
                    "use a URI or a shared filesystem for params.data on a multi-node cluster"
                ) from None
            files = sorted(ds.files)
            if len(files) >= self.world:
                mine = files[self.rank :: self.world]
                table = pads.dataset(mine, format="parquet", filesystem=ds.filesystem).to_table()
            else:
                table = ds.to_table()
                table = table.take(np.arange(self.rank, len(table), self.world))
            self._table = table
        return self._table


class _PreprocessedBatches:
    """Map-style dataset whose item i is batch i of the rank's rows, preprocessed (so the
    DataLoader's workers do the same batch-level work as Ray Data's map tasks)."""

    def __init__(self, table: pa.Table, batch_size: int, workload: Workload):
        self.table, self.batch_size, self.workload = table, batch_size, workload

    def __len__(self) -> int:
        return len(self.table) // self.batch_size

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        rows = table_columns(self.table.slice(i * self.batch_size, self.batch_size))
        return self.workload.preprocess(rows, training=True)


def train_source(config: dict[str, Any], workload: Workload, rank: int, world: int) -> Any:
    """This rank's training input for the launch: a Ray Data shard or a LoaderSource."""
    if config["input"] == "torch_loader":
        return LoaderSource(config["train_path"], workload, rank, world, config["data_workers"])
    import ray.train

    return ray.train.get_dataset_shard("train")


def worker_batches(
    source: Any, batch_size: int, prefetch: int, device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless stream of per-rank batches on `device`: epochs one after another.

    `source` is a Ray Data shard (input ray_data) or a LoaderSource (input torch_loader). On GPU
    both pin host memory and copy to the device ahead of the step that needs the batch.
    """
    if isinstance(source, LoaderSource):
        return _loader_batches(source, batch_size, prefetch, device)
    return _ray_batches(source, batch_size, prefetch, device)


def _ray_batches(
    shard: Any, batch_size: int, prefetch: int, device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yielded = False
        epoch = iter(
            shard.iter_torch_batches(
                batch_size=batch_size,
                prefetch_batches=prefetch,
                drop_last=True,
                device=device,
                pin_memory=device.type == "cuda",
            )
        )
        try:
            for batch in epoch:
                yielded = True
                yield batch
        finally:
            # A trial that stops mid-epoch stops its preprocessing now, not when the
            # iterator is garbage-collected (its prefetch threads keep it alive).
            close = getattr(epoch, "close", None)
            if close is not None:
                close()
        if not yielded:
            raise RuntimeError(_too_few_rows(batch_size))


def _loader_batches(
    source: LoaderSource, batch_size: int, prefetch: int, device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """A DataLoader over this rank's rows; prefetch_batches is spread over its workers
    (prefetch_factor = ceil(prefetch / workers), at least 1, as DataLoader requires)."""
    from torch.utils.data import DataLoader

    batches = _PreprocessedBatches(source.table(), batch_size, source.workload)
    if len(batches) == 0:
        raise RuntimeError(_too_few_rows(batch_size))
    cuda = device.type == "cuda"
    workers = source.workers
    loader = DataLoader(
        batches,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=cuda,
        persistent_workers=workers > 0,
        prefetch_factor=max(1, math.ceil(prefetch / workers)) if workers else None,
    )
    while True:
        for batch in loader:
            yield {k: v.to(device, non_blocking=cuda) for k, v in batch.items()}


def _too_few_rows(batch_size: int) -> str:
    return (
        f"the data shard holds fewer than batch_size={batch_size} rows; "
        "raise params.train_rows or lower the batch size"
    )
