"""Worker-side input: what a train worker reads, each trial's endless stream of host batches.

Two inputs (the `input` axis), the same preprocessing (`Workload.preprocess`) in both:
- ray_data: the driver put the stored rows into the object store (data/prepare.py). A workload
  without preprocessing has static, equal per-rank shards, each fetched onto its rank's node
  before the rank's first trial and then read as the Arrow tables this process holds
  (`local_shard`, `LocalShard`); one with preprocessing streams through Ray Train's split of
  the launch's one pass (`LaunchStream`), started before the first trial, taking block-sized
  Arrow chunks through Ray Data's `iter_batches`, `prefetch_batches` ahead (`arrow_chunks`).
  Either way the Arrow columns become tensors here (`torch_columns`) and are cut into each
  trial's batches (`Rebatcher`; pinned memory on GPU, copied to the device by feed.py);
- torch_loader: each rank reads its own slice of the stored rows into a torch DataLoader with
  `num_workers = data_workers`, pinned memory on GPU and persistent workers (`LoaderSource`).
The validation split, preprocessed for evaluation, is read once per launch (`validation_rows`).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import warnings
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from amdahl.data.storage import ROWS_PER_BLOCK, arrow_column, read_rows, table_columns
from amdahl.protocol.contract import LaunchConfig
from amdahl.workload.api import Workload

if TYPE_CHECKING:
    import torch

_VAL_CHUNK = 4096
#: Most of its node's object store a rank's shard may hold pinned (`local_shard`); a larger
#: shard is read as before, each block fetched when the loop reaches it.
_MAX_PINNED_SHARE = 0.5

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- validation split


def validation_rows(workload: Workload, source: Any, seed: int) -> dict[str, np.ndarray]:
    """The held-out split, preprocessed for evaluation (no augmentation): the user's
    (`source`, from `put_rows`) or, when None, generated here from `seed`, deterministically,
    and given to `preprocess` in the stored form the training rows have (`as_stored`)."""
    rows = (
        read_rows(source)
        if source is not None
        else as_stored(workload.generate("val", workload.rows("val"), seed))
    )
    if not workload.preprocesses:
        return rows
    n = len(next(iter(rows.values())))
    chunks = [
        workload.preprocess({k: v[i : i + _VAL_CHUNK] for k, v in rows.items()}, training=False)
        for i in range(0, n, _VAL_CHUNK)
    ]
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def as_stored(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Columns as they read back once stored (a 3-D column as (rows, width), ...): what both
    inputs hand `Workload.preprocess` (`storage.table_columns`)."""
    return table_columns(pa.table({k: arrow_column(v) for k, v in columns.items()}))


# --------------------------------------------------------------------------- ray_data shards


def local_shard(shard: Any) -> Any:
    """A rank's static shard (`rank_shards`, `repeat_to_cover`) held in this process as a
    `LocalShard`, every block fetched onto this node. Called in the train worker
    (`train_source`) when the rank first gets a world size's shard, before that trial starts.

    Why fetch: local training data becomes blocks in the driver's object store (`ray_dataset`)
    and the equal split leaves them there, so a rank on another node would pull its shard over
    the head node's link inside its first timed epoch; the d1 baseline that every speedup
    divides by, which reads the whole training set, most of all.

    How: one `ray.get` of the shard's distinct blocks (`shard_blocks`): the same objects, not
    copies, pulled onto this node in parallel from wherever copies are. A value read from the
    object store is zero-copy, and an object in use is never evicted, so the LocalShard's
    tables stay pinned in this node's store for the launch. Cost: this node's store holds the
    shard for the launch; shards of several world sizes share their whole blocks.

    Why the loop then reads the tables itself (`LocalShard.batches`), not through Ray Data's
    iterator: with every block already here, that iterator's threads only slice and hand over
    memory this process holds, yet they run beside the training thread and take its GIL: a
    one-device MLP trial's data wait (the gap between steps, the loop's bookkeeping in it)
    was 0.22-0.28 ms of a 3.5-4.3 ms step through them, 0.085-0.09 ms reading the tables here
    (docs/architecture.md, "What the loop costs beside a plain loop").

    Not chosen: copying the blocks with a task pinned to the rank's node
    (NodeAffinitySchedulingStrategy) makes new objects (twice the memory, new datasets) and
    needs each rank's node, which only Ray Train's placement decides, after the driver made
    the shards; `ray.wait(fetch_local=True)` fetches too but pins nothing, so a busy store
    could evict the copy before the loop reads it.

    Not done: a shard over `_MAX_PINNED_SHARE` of this node's object store, or one whose blocks
    are not Arrow tables, is read through Ray Data's iterator (the DataIterator is returned),
    each block fetched when the loop reaches it (pinning it would make the store spill). Ray
    Train's streaming split of a preprocessing workload (`get_dataset_shard`) cannot be fetched
    ahead like this: its blocks are made by the map tasks while the ranks iterate, and the
    split hands them to ranks as it goes (`LaunchStream`).
    """
    import ray

    bundles = _bundles(shard)  # read once: without a plan, listing them starts an executor
    blocks = _distinct_blocks(bundles)
    size, store = sum(blocks.values()), _object_store_bytes(ray.get_runtime_context().get_node_id())
    if size > _MAX_PINNED_SHARE * store:
        _log.warning(
            "a rank's shard (%.0f MB) is over %.0f%% of its node's object store (%.0f MB): its "
            "blocks are fetched as the training loop reads them",
            size / 1e6,
            100 * _MAX_PINNED_SHARE,
            store / 1e6,
        )
        return shard.iterator()
    start = time.perf_counter()
    values = dict(zip(blocks, ray.get(list(blocks)), strict=True))
    fetch_s = time.perf_counter() - start
    if not all(isinstance(v, pa.Table) for v in values.values()):
        return shard.iterator()
    tables = []
    for bundle in bundles:
        for entry, piece in zip(bundle.blocks, _slices(bundle), strict=True):
            table = values[entry.ref]
            tables.append(
                table if piece is None else table.slice(piece.start_offset, piece.num_rows)
            )
    return LocalShard(tables, fetch_s)


def shard_blocks(dataset: Any) -> dict[Any, int]:
    """A materialised dataset's distinct blocks, in reading order: reference -> bytes (a
    `repeat_to_cover` shard lists each block several times)."""
    return _distinct_blocks(_bundles(dataset))


def _distinct_blocks(bundles: list[Any]) -> dict[Any, int]:
    blocks: dict[Any, int] = {}
    for bundle in bundles:
        for entry in bundle.blocks:
            blocks.setdefault(entry.ref, entry.metadata.size_bytes or 0)
    return blocks


def _bundles(dataset: Any) -> list[Any]:
    """A materialised dataset's block bundles in reading order, read from its plan, which holds
    them; the DeveloperAPI `iter_internal_ref_bundles` gives the same bundles but starts a
    streaming executor for them (0.2 s and a log line per worker, measured here)."""
    dag = getattr(getattr(dataset, "_logical_plan", None), "dag", None)
    bundles = dag.output_data() if hasattr(dag, "output_data") else None
    return list(bundles if bundles is not None else dataset.iter_internal_ref_bundles())


def _slices(bundle: Any) -> tuple[Any, ...]:
    """Each block's row slice in `bundle` (None: the whole block)."""
    return getattr(bundle, "slices", None) or (None,) * len(bundle.blocks)


@dataclass
class LocalShard:
    """A rank's static shard as Arrow tables in this process, in reading order (`local_shard`);
    `fetch_s`: how long fetching them onto this node took."""

    tables: list[pa.Table] = field(repr=False)
    fetch_s: float

    @property
    def rows(self) -> int:
        return sum(len(t) for t in self.tables)

    def batches(
        self, batch_size: int, prefetch: int, pin: bool
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Endless `batch_size`-row batches from the shard's start, the tables read in order
        and again (`Rebatcher`). On CPU a table's tensors are views of its buffers, made when
        the loop first reaches it (~17 us per 2048-row MLP block) and kept: nothing to hide.
        With `pin` (a CUDA trial) each table gets one pinned copy on each pass, made `prefetch`
        batches ahead (in tables) in one thread, so that the copy to pinned memory is not the
        step's wait; pinned copies of the whole shard are not kept (pinned memory is scarce)."""
        if self.rows < batch_size:
            raise RuntimeError(_too_few_rows(batch_size))
        tables = [t for t in self.tables if len(t)]
        chunks: Iterator[dict[str, torch.Tensor]]
        if not pin:
            chunks = _views_kept(tables)
        elif prefetch == 0:
            chunks = (torch_columns(t, pin) for t in itertools.cycle(tables))
        else:
            ahead = math.ceil(prefetch * batch_size / (self.rows / len(tables)))
            chunks = _converted_ahead(itertools.cycle(tables), ahead, pin)
        try:
            yield from Rebatcher(chunks, pin).batches(batch_size)
        finally:
            chunks.close()  # a trial that stops stops its conversion thread now


def _views_kept(tables: list[pa.Table]) -> Iterator[dict[str, torch.Tensor]]:
    """Each table's tensors (`torch_columns`, views), made on the first pass, then reused."""
    views = []
    for table in tables:
        views.append(torch_columns(table, pin=False))
        yield views[-1]
    while True:
        yield from views


def _converted_ahead(
    tables: Iterator[pa.Table], ahead: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """`torch_columns` of each table, `ahead` tables converted ahead in one thread (the copy
    into pinned memory releases the GIL)."""
    with ThreadPoolExecutor(1, thread_name_prefix="amdahl-pin") as pool:
        pending: deque[Future] = deque()
        try:
            for table in tables:
                pending.append(pool.submit(torch_columns, table, pin))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _object_store_bytes(node_id: str) -> float:
    """The object store's capacity on node `node_id` (unbounded when Ray does not say)."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node["Resources"].get("object_store_memory", math.inf)
    return math.inf


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


# --------------------------------------------------------------------------- each trial's batches


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
    if isinstance(source, LocalShard):
        return source.batches(batch_size, prefetch, pin)
    return _ray_batches(source, batch_size, prefetch, pin)


def _ray_batches(
    shard: Any, batch_size: int, prefetch: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Training batches cut from block-sized chunks of a shard read through Ray Data's
    iterator (a shard too large to hold, `local_shard`), pass after pass (`_passes`).

    Each batch Ray Data forms costs a fixed ~1-3 ms here (a round trip to the split
    coordinator, block slicing and concatenation, conversion), which a rank waits for on every
    step when batches are small: the D2L MLP waited 2.7 ms of an 11 ms step. Fetching one
    block-sized chunk (`arrow_chunks`) and cutting it into batches (`Rebatcher`: views inside
    a chunk, one joined copy across a chunk's end) pays that once per chunk. `prefetch`
    batches ahead become ceil(prefetch * batch / chunk) chunks ahead (0 stays 0). Chunks stay
    on the host (pinned for a GPU); the feed copies one batch at a time, so a chunk never
    costs device memory beyond a batch.
    """
    chunk = max(batch_size, ROWS_PER_BLOCK // batch_size * batch_size)
    chunks = _passes(shard, chunk, math.ceil(prefetch * batch_size / chunk), pin, batch_size)
    try:
        yield from Rebatcher(chunks, pin).batches(batch_size)
    finally:
        # A trial that stops mid-pass stops its prefetching now, not when the iterator is
        # garbage-collected (its prefetch threads keep it alive).
        chunks.close()


def _passes(
    shard: Any, chunk: int, prefetch_chunks: int, pin: bool, batch_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless chunks: one pass over the shard (`arrow_chunks`) after another. A pass with
    fewer than `batch_size` rows is refused: its batches would repeat rows within a batch."""
    while True:
        rows = 0
        one_pass = arrow_chunks(shard, chunk, prefetch_chunks, pin)
        try:
            for columns in one_pass:
                rows += _rows(columns)
                yield columns
        finally:
            one_pass.close()
        if rows < batch_size:
            raise RuntimeError(_too_few_rows(batch_size))


def arrow_chunks(
    shard: Any, chunk: int, prefetch_chunks: int, pin: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """One pass over a Ray Data shard in `chunk`-row pieces, as torch tensors: Arrow batches
    from Ray Data's prefetching iterator, converted here by `torch_columns`.

    Why not `iter_torch_batches`: its conversion (tensor-extension unwrapping, per-column
    numpy and torch steps) runs in Ray Data's threads inside the training process, 6-10 ms
    per 2048-row MLP chunk measured here against ~0.3 ms for `torch_columns`, and those threads
    hold the GIL the training thread needs (py-spy: 30% of the GIL-holding samples of a
    one-device MLP trial; docs/architecture.md, "What the loop costs beside a plain loop")."""
    batches = shard.iter_batches(
        batch_size=chunk, prefetch_batches=prefetch_chunks, batch_format="pyarrow"
    )
    try:
        for table in batches:
            yield torch_columns(table, pin)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def torch_columns(table: pa.Table, pin: bool) -> dict[str, torch.Tensor]:
    """A chunk's columns as tensors (`storage.table_columns`): views of the Arrow buffers
    where the layout allows (read-only memory: a workload must not write into its batch),
    or, with `pin` (a CUDA trial), one copy into pinned memory so that the feed's copies to the
    device are asynchronous."""
    import torch

    with warnings.catch_warnings():  # torch warns once that the Arrow buffer is read-only
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        columns = {k: torch.from_numpy(v) for k, v in table_columns(table).items()}
    return join_rows([columns], pin) if pin else columns


class Rebatcher:
    """Batches of any size cut from an endless stream of chunks (dicts of tensors): views of a
    chunk, or, for a batch spanning chunks, the rows it needs copied once into a buffer of its
    own, pinned when the chunks are (`join_rows`), so that its copy to the device is
    asynchronous too. The rows a batch leaves in a chunk go to the next batch, also to the
    first batch of a later `batches` call (a LaunchStream's next trial)."""

    def __init__(self, chunks: Iterator[dict[str, torch.Tensor]], pin: bool):
        self._chunks, self._pin = chunks, pin
        # The chunk being cut ({}: none taken yet), its first row not handed out, its rows.
        self._chunk: dict[str, torch.Tensor] = {}
        self._at = self._end = 0

    def fill(self) -> None:
        """Take the first chunk now, if none was taken yet."""
        if not self._chunk:
            self._take(next(self._chunks), 0)

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless `batch_size`-row batches."""
        while True:
            while self._at == self._end:
                self._take(next(self._chunks), 0)
            chunk, at = self._chunk, self._at
            if self._end - at >= batch_size:  # inside this chunk: a view, one slice a column
                self._at = at + batch_size
                yield {k: v[at : at + batch_size] for k, v in chunk.items()}
                continue
            parts = [{k: v[at:] for k, v in chunk.items()}]
            need = batch_size - (self._end - at)  # rows still wanted from the chunks after it
            chunk = next(self._chunks)
            while _rows(chunk) < need:
                parts.append(chunk)
                need -= _rows(chunk)
                chunk = next(self._chunks)
            parts.append({k: v[:need] for k, v in chunk.items()})
            self._take(chunk, need)
            yield join_rows(parts, self._pin)

    def _take(self, chunk: dict[str, torch.Tensor], at: int) -> None:
        self._chunk, self._at, self._end = chunk, at, _rows(chunk)


class LaunchStream:
    """One rank's training input for a whole launch whose workload preprocesses (input
    ray_data): one pass of the launch's Ray Data pipeline, started once before the first trial
    (`warm`), from which each trial slices batches of its own size (`batches`).

    Why: every new pass over Ray Train's streaming split starts the pipeline again (a barrier
    across ranks, new preprocessing tasks, their first blocks): seconds that used to land in
    each trial's first step. The pass covers every trial of the launch (`with_preprocessing`), and
    the rows a trial leaves in a chunk go to the next one (`Rebatcher`). `batch_size`: the
    launch's largest batch (default `chunk`); a pass with fewer rows is refused.
    """

    def __init__(
        self, shard: Any, chunk: int, prefetch_chunks: int, pin: bool, batch_size: int = 0
    ):
        # A launch longer than its pass starts another (never expected).
        passes = _passes(shard, chunk, prefetch_chunks, pin, batch_size or chunk)
        self._batcher = Rebatcher(passes, pin)

    def warm(self) -> float:
        """Start the pipeline and wait for its first chunk; returns the seconds it took."""
        start = time.perf_counter()
        self._batcher.fill()
        return time.perf_counter() - start

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless `batch_size`-row batches, continuing where the previous trial stopped."""
        return self._batcher.batches(batch_size)


def _rows(batch: dict[str, Any]) -> int:
    return len(next(iter(batch.values())))


def join_rows(parts: list[dict[str, torch.Tensor]], pin: bool) -> dict[str, torch.Tensor]:
    """`parts`' rows, one after another, in one new buffer per column: pinned with `pin` (a
    CUDA trial), since `torch.cat` allocates pageable memory, whose copy to the device the
    host would wait for (docs/architecture.md, "What a step's columns mean")."""
    import torch

    out = {}
    for key, first in parts[0].items():
        columns = [part[key] for part in parts]
        shape = (sum(len(c) for c in columns), *first.shape[1:])
        out[key] = torch.cat(columns, out=_host_buffer(shape, first.dtype, pin))
    return out


def _host_buffer(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    import torch

    return torch.empty(shape, dtype=dtype, pin_memory=pin)


def launch_stream(shard: Any, launch: LaunchConfig, pin: bool) -> LaunchStream:
    """The launch's stream over Ray Train's split of its preprocessed dataset: chunks of whole
    largest batches (about a block), prefetched as the largest `prefetch_batches` asks."""
    largest = max(t.per_device_batch for t in launch.trials)
    chunk = max(largest, ROWS_PER_BLOCK // largest * largest)
    prefetch = max(t.settings.prefetch_batches for t in launch.trials)
    return LaunchStream(shard, chunk, math.ceil(prefetch * largest / chunk), pin, largest)


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
