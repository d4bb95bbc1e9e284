"""The input pipeline: rows stored as parquet, preprocessed and fed to each train worker.

Storage. Generated rows are written once per (workload, the parameters that decide them, split,
seed) into a cache directory and reused by every trial and sweep that asks for the same data; a
user's own parquet (`params.data`, a local path or any URI pyarrow and Ray Data read) is used in
place. `platform data fashion-mnist --from DIR` converts Fashion-MNIST's IDX files to that layout.

Two inputs (the `input` axis), the same preprocessing (`Workload.preprocess`) in both:
- ray_data: the sweep driver reads the parquet once into the object store. A workload without
  preprocessing gets static, equal per-rank shards of those blocks (`rank_shards`); one with
  preprocessing gets a `map_batches` stage with `data_workers` concurrent tasks of
  `cpus_per_data_worker` CPUs behind Ray Train's streaming split. Each rank takes block-sized
  chunks through `iter_torch_batches`, `prefetch_batches` ahead, and slices them into batches
  (pinned memory and device transfer on GPU);
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
#: Most epochs one pass of a launch's input streams (each adds a block reference per block);
#: a trial that needs more starts a new pass, at one epoch boundary's cost.
MAX_EPOCHS_PER_PASS = 64


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
    """A URI as given; a local path made absolute and checked."""
    if _is_uri(source):
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


def read_table(path: str) -> pa.Table:
    """A parquet file or directory (path or URI) as one Arrow table."""
    import pyarrow.dataset as pads

    return pads.dataset(path, format="parquet").to_table()


def read_rows(source: Any) -> dict[str, np.ndarray]:
    """Rows from `shared_rows`'s answer (a URI, a path, or an object-store table) as numpy."""
    return table_columns(_table(source))


def shared_rows(path: str) -> Any:
    """How workers on any node reach the parquet at `path`: a URI as is (each reader opens it
    itself); a local path is read here, in the driver, and its Arrow table put in the object
    store, because read tasks and train workers on other nodes cannot see this machine's disk.
    Returns the URI or the table's ObjectRef."""
    if _is_uri(path):
        return path
    import ray

    return ray.put(read_table(path))


def _table(source: Any) -> pa.Table:
    if isinstance(source, str):
        return read_table(source)
    import ray

    return ray.get(source)


def _is_uri(path: str) -> bool:
    return "://" in path


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
    """The held-out split, preprocessed for evaluation (no augmentation): the user's
    (`config["val_rows"]`, from `shared_rows`) or generated here, deterministically."""
    source = config.get("val_rows")
    rows = (
        read_rows(source)
        if source is not None
        else workload.generate("val", workload.rows("val"), config["seed"])
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
    """A materialised Ray Dataset of the stored rows in block-sized pieces, so that every epoch
    of every trial streams from the object store. A URI is read by Ray Data's read tasks
    (sized to the plan's data CPUs) wherever they run; a local path is read here, in the
    driver, since read tasks on other nodes cannot see this machine's disk."""
    import ray.data

    path = str(path)
    if _is_uri(path):
        ds = ray.data.read_parquet(path, num_cpus=cpus_per_read_task)
        return ds.repartition(target_num_rows_per_block=_ROWS_PER_BLOCK, strict=True).materialize()
    # Blocks cut here: from_arrow would ask a Ray task for the table's metadata and
    # repartition in more tasks (a worker process to start first: 0.9 s of a laptop sweep's
    # start, against 0.04 s for this). Ray serialises each slice alone, not its parent table.
    table = read_table(path)
    return ray.data.from_blocks(
        [table.slice(i, _ROWS_PER_BLOCK) for i in range(0, max(1, len(table)), _ROWS_PER_BLOCK)]
    )


def rank_shards(base: Any, world: int) -> list[Any]:
    """`base` split into `world` equal, materialised shards, one per rank. Called in the
    driver before any worker group holds CPUs: splitting a block runs Ray tasks, which a
    started worker group could leave without a CPU (seen: a 2-CPU box hung)."""
    return [base] if world == 1 else base.split(world, equal=True)


def repeated(shard: Any, rows: int) -> Any:
    """`shard`'s blocks listed enough times to stream `rows` rows in one pass (one epoch more
    than needed covers rows dropped at chunk ends). The objects are shared, not copied, and no
    task runs. Why: a new pass over a dataset costs every rank 20-120 ms here (a fresh
    iterator, and under Ray Train's streaming split a barrier across ranks), which with the
    D2L MLP's 32-step epochs was 20% of each step."""
    epochs = _epochs_per_pass(rows, shard.count())
    return shard.union(*[shard] * (epochs - 1)).materialize() if epochs > 1 else shard


def _epochs_per_pass(rows: int, rows_per_epoch: int) -> int:
    return min(MAX_EPOCHS_PER_PASS, math.ceil(rows / max(1, rows_per_epoch)) + 1)


def preprocessed(
    base: Any,
    workload: Workload,
    workers: int,
    cpus_per_worker: float,
    batch_size: int,
    rows_per_pass: int,
) -> Any:
    """The training input of a launch whose workload preprocesses: `base` repeated to cover
    `rows_per_pass` rows (see `repeated`), then the workload's training preprocessing as a Ray
    Data operator with `workers` concurrent tasks of `cpus_per_worker` CPUs (the plan keeps
    those CPUs free), each task preprocessing at least one block of rows. Ray Train's streaming
    split then hands its output to the ranks, balancing as it goes."""
    import ray.data

    epochs = _epochs_per_pass(rows_per_pass, base.count())
    ds = base.union(*[base] * (epochs - 1)) if epochs > 1 else base
    ds = ds.map_batches(
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
    """What one rank's torch DataLoader reads: its slice of the stored rows (`rows`: a parquet
    path or URI, or an object-store table from `shared_rows`)."""

    rows: Any
    workload: Workload
    rank: int
    world: int
    workers: int
    _table: pa.Table | None = field(default=None, repr=False)

    def table(self) -> pa.Table:
        """This rank's rows (read once per launch): its contiguous share of an object-store
        table; of files, every world-th file when there are enough, else every world-th row."""
        if self._table is None and not isinstance(self.rows, str):
            import ray

            table = ray.get(self.rows)
            n = len(table)
            start, stop = self.rank * n // self.world, (self.rank + 1) * n // self.world
            self._table = table.slice(start, stop - start)
        if self._table is None:
            import pyarrow.dataset as pads

            try:
                ds = pads.dataset(self.rows, format="parquet")
            except (FileNotFoundError, pa.ArrowInvalid) as e:
                raise RuntimeError(
                    f"input torch_loader could not read {self.rows} on this worker ({e})"
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
    """This rank's training input for trials on `world` ranks: its own shard (`train_shards`,
    per world size), Ray Train's streaming split of the preprocessed dataset, or a LoaderSource."""
    if config["input"] == "torch_loader":
        return LoaderSource(config["train_rows"], workload, rank, world, config["data_workers"])
    if config.get("train_shards"):
        return config["train_shards"][world][rank].iterator()
    import ray.train

    if world != config["resources"]["workers"]:
        raise RuntimeError(
            f"Ray Train's dataset split serves {config['resources']['workers']} workers, not a "
            f"trial on {world}: the planner must not share this launch across device counts"
        )
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
    """Training batches sliced from block-sized chunks of the shard.

    Each batch Ray Data forms costs a fixed ~1-3 ms here (a round trip to the split
    coordinator, block slicing and concatenation, conversion), which a rank waits for on every
    step when batches are small: the D2L MLP waited 2.7 ms of an 11 ms step. Fetching one
    block-sized chunk and slicing it into batches (views, no copies) pays that once per chunk.
    `prefetch` batches ahead become ceil(prefetch * batch / chunk) chunks ahead (0 stays 0).
    Chunks stay on the host (pinned on GPU) and each batch is copied to the device as it is
    taken, so a chunk never costs device memory beyond one batch.
    """
    chunk = max(batch_size, _ROWS_PER_BLOCK // batch_size * batch_size)
    cuda = device.type == "cuda"
    while True:
        yielded = False
        epoch = iter(
            shard.iter_torch_batches(
                batch_size=chunk,
                prefetch_batches=math.ceil(prefetch * batch_size / chunk),
                drop_last=False,
                device="cpu",  # the default, "auto", would copy whole chunks to the GPU
                pin_memory=cuda,
            )
        )
        try:
            for rows in epoch:
                n = len(next(iter(rows.values())))
                for start in range(0, n - batch_size + 1, batch_size):
                    yielded = True
                    yield {
                        k: v[start : start + batch_size].to(device, non_blocking=cuda)
                        for k, v in rows.items()
                    }
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
