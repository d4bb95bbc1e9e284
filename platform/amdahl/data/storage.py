"""The input pipeline: rows stored as parquet, preprocessed and fed to each train worker.

Storage. Generated rows are written once per (workload, the parameters that decide them, split,
seed) into a cache directory and reused by every trial and sweep that asks for the same data; a
user's own parquet (`params.data`, a local path or any URI pyarrow and Ray Data read) is used in
place. `platform data fashion-mnist --from DIR` converts Fashion-MNIST's IDX files to that layout.

Two inputs (the `input` axis), the same preprocessing (`Workload.preprocess`) in both:
- ray_data: the sweep driver reads the parquet once into the object store. A workload without
  preprocessing gets static, equal per-rank shards of those blocks (`rank_shards`); one with
  preprocessing gets a `map_batches` stage with `data_workers` concurrent tasks of
  `cpus_per_data_worker` CPUs behind Ray Train's streaming split. A static shard is fetched
  onto its rank's node before the rank's first trial (`local_shard`). Each rank takes block-sized
  chunks through `iter_torch_batches`, `prefetch_batches` ahead, and slices them into batches
  (pinned memory and device transfer on GPU);
- torch_loader: each rank reads its own slice of the parquet into a torch DataLoader with
  `num_workers = data_workers`, pinned memory on GPU and persistent workers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import shutil
import struct
import time
import zlib
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

    from amdahl.worker.contract import LaunchConfig

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
#: Most of its node's object store a rank's shard may hold pinned (`local_shard`); a larger
#: shard is read as before, each block fetched when the loop reaches it.
_MAX_PINNED_SHARE = 0.5

_log = logging.getLogger(__name__)


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
    if (out / _COMPLETE).exists():
        return out
    # A copy appears whole, by rename, with its marker; a non-empty directory without one is
    # damaged or not amdahl's, and the rename would fail on it, so say so before generating.
    if out.exists() and not _is_empty_dir(out):
        raise UserError(
            f"{out}: a cached dataset directory without its {_COMPLETE} marker (damaged, or "
            "not written by amdahl); remove it and run again to regenerate it"
        )
    _write_parquet_dir(workload.generate(split, workload.rows(split), seed), out)
    if not (out / _COMPLETE).exists():
        raise UserError(
            f"{out}: could not store the generated dataset there (no {_COMPLETE} after the "
            "write); check that the directory is writable, or set AMDAHL_DATA_DIR elsewhere"
        )
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
    """Rows from `put_rows`'s answer (a URI, a path, or an object-store table) as numpy."""
    return table_columns(_table(source))


def put_rows(path: str) -> Any:
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


def validation_rows(workload: Workload, source: Any, seed: int) -> dict[str, np.ndarray]:
    """The held-out split, preprocessed for evaluation (no augmentation): the user's
    (`source`, from `put_rows`) or, when None, generated here from `seed`, deterministically."""
    rows = (
        read_rows(source)
        if source is not None
        else workload.generate("val", workload.rows("val"), seed)
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
#: Largest IDX payload read (Fashion-MNIST's largest file holds 47 MB). The header's sizes fix
#: how much is read, so a gzip bomb or a damaged header cannot make the reader allocate more.
MAX_IDX_BYTES = 2**30
#: What `_write_parquet_dir` puts into a directory it has finished writing.
_COMPLETE = "_COMPLETE"


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (the MNIST format, gzipped or not): magic = 0, 0, dtype code, ndim; then
    ndim big-endian uint32 sizes; then the data, big-endian, row-major.

    Reads exactly what the header announces (at most MAX_IDX_BYTES); anything else (a short or
    long file, a damaged gzip stream, an unreadable path) is a UserError naming the file."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            magic = f.read(4)
            if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_DTYPES:
                raise UserError(f"{path}: not an IDX file (bad magic number {magic.hex()})")
            ndim = magic[3]
            header = f.read(4 * ndim)
            if len(header) < 4 * ndim:
                raise UserError(
                    f"{path}: truncated IDX header (the magic number announces {ndim} "
                    f"dimensions, {4 * ndim} bytes of sizes, but the file ends after "
                    f"{len(header)}); download the file again"
                )
            dims = struct.unpack(f">{ndim}I", header)
            dtype = np.dtype(_IDX_DTYPES[magic[2]])
            expected = math.prod(dims) * dtype.itemsize
            # sizes of 0 beside huge ones hold nothing but still make no array shape
            if math.prod(max(d, 1) for d in dims) * dtype.itemsize > MAX_IDX_BYTES:
                raise UserError(
                    f"{path}: header says {dims} {dtype.name} values ({expected:,} bytes), "
                    f"over the {MAX_IDX_BYTES:,}-byte limit of this reader; not an IDX file "
                    "amdahl converts (a damaged header?)"
                )
            raw = f.read(expected + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{path}: cannot read it as an IDX file ({e})") from None
    if len(raw) != expected:
        held = f"only {len(raw):,} bytes" if len(raw) < expected else "more bytes than that"
        raise UserError(
            f"{path}: header says {dims} {dtype.name} values ({expected:,} bytes) but the file "
            f"holds {held}; the file is truncated or damaged, download it again"
        )
    data = np.frombuffer(raw, dtype=dtype)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def convert_fashion_mnist(src: str | Path, out: str | Path) -> Path:
    """Fashion-MNIST's four IDX files in `src` -> `out/train/` and `out/val/` parquet
    (`image`: 784 raw uint8 bytes, 28x28 row-major; `label`: int64), the layout `params.data`
    reads. The 10,000 t10k rows become the validation split."""
    src, out = Path(src), Path(out)
    splits = {}
    for split, (images_name, labels_name) in FASHION_MNIST_FILES.items():
        images = read_idx(_find(src, images_name))
        labels = read_idx(_find(src, labels_name))
        if (
            images.ndim != 3
            or images.dtype != np.uint8
            or labels.ndim != 1
            or labels.dtype.kind not in "iu"
            or len(images) != len(labels)
        ):
            raise UserError(
                f"{src}: {images_name} holds {images.dtype} {images.shape} and {labels_name} "
                f"{labels.dtype} {labels.shape}; expected (n, rows, cols) uint8 images and n "
                "integer labels"
            )
        splits[split] = (images, labels)
    targets = {split: out / split for split in splits}
    for target in targets.values():  # all checked before anything is removed
        _check_replaceable(target)
    for split, (images, labels) in splits.items():
        flat = np.ascontiguousarray(images).reshape(len(images), -1)
        encoded = np.empty(len(flat), dtype=object)
        encoded[:] = [row.tobytes() for row in flat]
        target = targets[split]
        try:
            if target.exists():
                shutil.rmtree(target)
            _write_parquet_dir({"image": encoded, "label": labels.astype(np.int64)}, target)
        except OSError as e:
            raise UserError(f"{target}: cannot write the {split} split there ({e})") from None
        if not (target / _COMPLETE).exists():  # the rename into place did not happen
            raise UserError(
                f"{target}: the {split} split was not written (another process holds the "
                "directory?); check it and run again"
            )
    return out


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def _check_replaceable(target: Path) -> None:
    """`target` may be replaced: it does not exist, is an empty directory, or is a split this
    converter wrote (its `_COMPLETE` marker and part-*.parquet files, nothing else)."""
    if not target.exists() and not target.is_symlink():
        return
    if _is_empty_dir(target):
        return
    ours = (
        target.is_dir()
        and not target.is_symlink()
        and (target / _COMPLETE).is_file()
        and all(
            p.name == _COMPLETE or (p.name.startswith("part-") and p.suffix == ".parquet")
            for p in target.iterdir()
        )
    )
    if not ours:
        raise UserError(
            f"{target}: exists and is not a dataset split amdahl wrote (no {_COMPLETE} marker "
            "beside only part-*.parquet files), so it is left alone; choose another --out, or "
            "move it away yourself"
        )


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


def local_shard(shard: Any) -> Any:
    """A rank's static shard (`rank_shards`, `repeat_to_cover`) as the DataIterator its timed loop
    reads, with every block already in this node's object store. Called in the train worker
    (`train_source`) when the rank first gets a world size's shard, before that trial starts.

    Why: local training data becomes blocks in the driver's object store (`ray_dataset`) and
    the equal split leaves them there, so a rank on another node would pull its shard over
    the head node's link inside its first timed epoch; the d1 baseline that every speedup
    divides by, which reads the whole training set, most of all.

    How: one `ray.get` of the shard's distinct blocks (`shard_blocks`): the same objects, not
    copies, pulled onto this node in parallel from wherever copies are. The values are kept
    on the iterator (`local_blocks`) for the launch: a value read from the object store is
    zero-copy, and an object in use is never evicted, so the local copies stay pinned and the
    loop's own `ray.get` of the same references reads them here (the multi-node test checks
    that Ray Data counts every block local, none remote). `local_fetch_s` is how long the
    fetch took, None when nothing was fetched. Cost: this node's store holds the shard for
    the launch; shards of several world sizes share their whole blocks.

    Not chosen: copying the blocks with a task pinned to the rank's node
    (NodeAffinitySchedulingStrategy) makes new objects (twice the memory, new datasets) and
    needs each rank's node, which only Ray Train's placement decides, after the driver made
    the shards; `ray.wait(fetch_local=True)` fetches too but pins nothing, so a busy store
    could evict the copy before the loop reads it.

    Not done: a shard over `_MAX_PINNED_SHARE` of this node's object store is read as before
    (pinning it would make the store spill). Ray Train's streaming split of a preprocessing
    workload (`get_dataset_shard`) cannot be fetched ahead like this: its blocks are made by
    the map tasks while the ranks iterate, and the split hands them to ranks as it goes.
    """
    import ray

    blocks = shard_blocks(shard)
    iterator = shard.iterator()
    iterator.local_blocks, iterator.local_fetch_s = None, None
    size, store = sum(blocks.values()), _object_store_bytes(ray.get_runtime_context().get_node_id())
    if size > _MAX_PINNED_SHARE * store:
        _log.warning(
            "a rank's shard (%.0f MB) is over %.0f%% of its node's object store (%.0f MB): its "
            "blocks are fetched as the training loop reads them",
            size / 1e6,
            100 * _MAX_PINNED_SHARE,
            store / 1e6,
        )
        return iterator
    start = time.perf_counter()
    iterator.local_blocks = ray.get(list(blocks))
    iterator.local_fetch_s = time.perf_counter() - start
    return iterator


def shard_blocks(dataset: Any) -> dict[Any, int]:
    """A materialised dataset's distinct blocks, in reading order: reference -> bytes (a
    `repeat_to_cover` shard lists each block several times). Read from the dataset's plan, which
    holds them; the DeveloperAPI `iter_internal_ref_bundles` gives the same bundles but starts
    a streaming executor for them (0.2 s and a log line per worker, measured here)."""
    dag = getattr(getattr(dataset, "_logical_plan", None), "dag", None)
    bundles = dag.output_data() if hasattr(dag, "output_data") else None
    if bundles is None:
        bundles = dataset.iter_internal_ref_bundles()
    blocks: dict[Any, int] = {}
    for bundle in bundles:
        for entry in bundle.blocks:
            blocks.setdefault(entry.ref, entry.metadata.size_bytes or 0)
    return blocks


def _object_store_bytes(node_id: str) -> float:
    """The object store's capacity on node `node_id` (unbounded when Ray does not say)."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node["Resources"].get("object_store_memory", math.inf)
    return math.inf


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
    path or URI, or an object-store table from `put_rows`)."""

    rows: Any
    workload: Workload
    rank: int
    world: int
    workers: int
    _table: pa.Table | None = field(default=None, repr=False)

    def table(self) -> pa.Table:
        """This rank's rows (read once per launch): its contiguous share of an object-store
        table; of files, every world-th file when there are enough, else every world-th row."""
        if self._table is None and isinstance(self.rows, pa.Table):
            n = len(self.rows)  # rows in this process (tests, and GPU checks without Ray)
            start, stop = self.rank * n // self.world, (self.rank + 1) * n // self.world
            self._table = self.rows.slice(start, stop - start)
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


def train_source(
    launch: LaunchConfig, workload: Workload, rank: int, world: int, pin: bool = False
) -> Any:
    """This rank's training input for trials on `world` ranks: its own shard (`train_shards`,
    per world size) fetched onto this node (`local_shard`), a LaunchStream over Ray Train's
    streaming split of the preprocessed dataset, or a LoaderSource."""
    if launch.input == "torch_loader":
        return LoaderSource(launch.train_rows, workload, rank, world, launch.data_workers)
    if launch.train_shards:
        return local_shard(launch.train_shards[world][rank])
    import ray.train

    if world != launch.resources.workers:
        raise RuntimeError(
            f"Ray Train's dataset split serves {launch.resources.workers} workers, not a "
            f"trial on {world}: the planner must not share this launch across device counts"
        )
    return launch_stream(ray.train.get_dataset_shard("train"), launch, pin)


def host_batches(
    source: Any, batch_size: int, prefetch: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless stream of this rank's training batches in host memory: epochs one after another.

    `source` is a Ray Data shard (input ray_data) or a LoaderSource (input torch_loader). With
    `pin` (a CUDA device) the batches are in pinned memory, so that `feed.DeviceFeed` can copy
    them to the device asynchronously, overlapped with the previous step.
    """
    if isinstance(source, LoaderSource):
        return _loader_batches(source, batch_size, prefetch, pin)
    if isinstance(source, LaunchStream):
        return source.batches(batch_size)
    return _ray_batches(source, batch_size, prefetch, pin)


def _ray_batches(
    shard: Any, batch_size: int, prefetch: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Training batches sliced from block-sized chunks of the shard.

    Each batch Ray Data forms costs a fixed ~1-3 ms here (a round trip to the split
    coordinator, block slicing and concatenation, conversion), which a rank waits for on every
    step when batches are small: the D2L MLP waited 2.7 ms of an 11 ms step. Fetching one
    block-sized chunk and slicing it into batches (views, no copies) pays that once per chunk.
    `prefetch` batches ahead become ceil(prefetch * batch / chunk) chunks ahead (0 stays 0).
    Chunks stay on the host (pinned for a GPU); the feed copies one batch at a time, so a chunk
    never costs device memory beyond a batch.
    """
    chunk = max(batch_size, _ROWS_PER_BLOCK // batch_size * batch_size)
    while True:
        yielded = False
        epoch = iter(
            shard.iter_torch_batches(
                batch_size=chunk,
                prefetch_batches=math.ceil(prefetch * batch_size / chunk),
                drop_last=False,
                device="cpu",  # the default, "auto", would copy whole chunks to the GPU
                pin_memory=pin,
            )
        )
        try:
            for rows in epoch:
                n = len(next(iter(rows.values())))
                for start in range(0, n - batch_size + 1, batch_size):
                    yielded = True
                    yield {k: v[start : start + batch_size] for k, v in rows.items()}
        finally:
            # A trial that stops mid-epoch stops its preprocessing now, not when the
            # iterator is garbage-collected (its prefetch threads keep it alive).
            close = getattr(epoch, "close", None)
            if close is not None:
                close()
        if not yielded:
            raise RuntimeError(_too_few_rows(batch_size))


class LaunchStream:
    """One rank's training input for a whole launch whose workload preprocesses (input
    ray_data): one pass of the launch's Ray Data pipeline, started once before the first trial
    (`warm`), from which each trial slices batches of its own size (`batches`).

    Why: every new pass over Ray Train's streaming split starts the pipeline again (a barrier
    across ranks, new preprocessing tasks, their first blocks): seconds that used to land in
    each trial's first step. The pass covers every trial of the launch (`with_preprocessing`), and
    the rows a trial leaves in a chunk go to the next one.
    """

    def __init__(self, shard: Any, chunk: int, prefetch_chunks: int, pin: bool):
        self._shard, self._chunk, self._prefetch, self._pin = shard, chunk, prefetch_chunks, pin
        self._chunks: Iterator[dict[str, torch.Tensor]] | None = None
        self._rest: dict[str, torch.Tensor] | None = None  # rows not yet handed to a trial

    def warm(self) -> float:
        """Start the pipeline and wait for its first chunk; returns the seconds it took."""
        start = time.perf_counter()
        if self._rest is None:
            self._rest = self._next_chunk()
        return time.perf_counter() - start

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless `batch_size`-row batches (views of a chunk; a batch spanning two chunks is
        joined, one copy)."""
        import torch

        while True:
            rest = self._rest if self._rest is not None else self._next_chunk()
            while _rows(rest) < batch_size:
                more = self._next_chunk()
                rest = {k: torch.cat([v, more[k]]) for k, v in rest.items()}
            self._rest = {k: v[batch_size:] for k, v in rest.items()}
            yield {k: v[:batch_size] for k, v in rest.items()}

    def _next_chunk(self) -> dict[str, torch.Tensor]:
        if self._chunks is None:
            self._chunks = self._epochs()
        return next(self._chunks)

    def _epochs(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:  # a launch longer than its pass starts another (never expected)
            yielded = False
            for rows in self._shard.iter_torch_batches(
                batch_size=self._chunk,
                prefetch_batches=self._prefetch,
                drop_last=False,
                device="cpu",  # the feed copies one batch at a time to the device
                pin_memory=self._pin,
            ):
                yielded = True
                yield rows
            if not yielded:
                raise RuntimeError(_too_few_rows(self._chunk))


def _rows(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def launch_stream(shard: Any, launch: LaunchConfig, pin: bool) -> LaunchStream:
    """The launch's stream over Ray Train's split of its preprocessed dataset: chunks of whole
    largest batches (about a block), prefetched as the largest `prefetch_batches` asks."""
    largest = max(t.per_device_batch for t in launch.trials)
    chunk = max(largest, _ROWS_PER_BLOCK // largest * largest)
    prefetch = max(t.prefetch_batches for t in launch.trials)
    return LaunchStream(shard, chunk, math.ceil(prefetch * largest / chunk), pin)


def _loader_batches(
    source: LoaderSource, batch_size: int, prefetch: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """A DataLoader over this rank's rows; prefetch_batches is spread over its workers
    (prefetch_factor = ceil(prefetch / workers), at least 1, as DataLoader requires)."""
    from torch.utils.data import DataLoader

    batches = _PreprocessedBatches(source.table(), batch_size, source.workload)
    if len(batches) == 0:
        raise RuntimeError(_too_few_rows(batch_size))
    workers = source.workers
    loader = DataLoader(
        batches,
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=workers > 0,
        prefetch_factor=max(1, math.ceil(prefetch / workers)) if workers else None,
    )
    while True:
        yield from loader


def _too_few_rows(batch_size: int) -> str:
    return (
        f"the data shard holds fewer than batch_size={batch_size} rows; "
        "raise params.train_rows or lower the batch size"
    )
