"""Stored datasets: what rows are stored, where, and how they are read back.

Generated rows are written once per (workload, the parameters that decide them, the code of its
`generate`, split, seed) into a cache directory and reused by every trial and sweep that asks
for the same data (an edited `generate` writes new rows: `platform data list` and `platform
data clear` show and remove the copies); a user's
own parquet (`params.data`, a local path or any URI pyarrow and Ray Data read) is used in place.
Both the driver (`put_rows` into Ray's object store; Ray Datasets built in data/prepare.py)
and the train workers (worker/input.py) read stored rows through this module, which imports
nothing of either side. `platform data fashion-mnist` (data/fashion_mnist.py) writes this
layout too.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from amdahl.errors import UserError
from amdahl.workload.api import Workload

#: Where generated datasets live; AMDAHL_DATA_DIR overrides.
DEFAULT_CACHE = Path(os.environ.get("AMDAHL_DATA_DIR", Path.home() / ".cache" / "amdahl" / "data"))
_ROWS_PER_FILE = 4096
#: Rows per block of the materialised dataset, and the fewest rows one preprocessing task
#: handles. Each Ray Data task and block costs ~15 ms of scheduling and object-store traffic
#: here whatever its work (256-row tasks capped a 2-CPU box at ~17k rows/s), so tasks must be
#: large: with RandAugment-style images, 512-row tasks fed 0.6x of a DataLoader's rows/s,
#: 2048-row tasks 0.9x. The price is latency: an epoch's first batch waits for a whole task.
ROWS_PER_BLOCK = 2048
#: What `write_parquet_dir` puts into a directory it has finished writing.
COMPLETE_MARKER = "_COMPLETE"
#: What a generated copy records of its making (`cached_datasets` lists it).
SOURCE_FILE = "_SOURCE.json"

_log = logging.getLogger(__name__)


def stored_dataset(
    workload: Workload, name: str, split: str, seed: int, cache: Path = DEFAULT_CACHE
) -> Path:
    """Directory of parquet shards for this workload's split; generated on first use only.

    Keyed by the parameters that decide the rows (`Workload.data_params`), so sweeping a model
    width or an augmentation reuses the same files, and by the source of the workload's
    `generate` (`generate_code`), so an edited `generate` writes new rows instead of training
    on the old ones; a copy left by an earlier `generate` is said so, once, and kept.
    """
    code = generate_code(workload)
    identity = [name, workload.data_key(), split, seed]
    key = hashlib.sha1(json.dumps([*identity, code], sort_keys=True, default=str).encode())
    out = cache / f"{name}-{split}-{key.hexdigest()[:12]}"
    if (out / COMPLETE_MARKER).exists():
        return out
    _note_older_copies(cache, name, split, identity)
    # A copy appears whole, by rename, with its marker; a non-empty directory without one is
    # damaged or not amdahl's, and the rename would fail on it, so say so before generating.
    if out.exists() and not is_empty_dir(out):
        raise UserError(
            f"{out}: a cached dataset directory without its {COMPLETE_MARKER} marker (damaged, "
            "or not written by amdahl); remove it and run again to regenerate it"
        )
    made = {"name": name, "split": split, "seed": seed, "data_key": workload.data_key()}
    made["generate_code"] = code
    write_parquet_dir(workload.generate(split, workload.rows(split), seed), out, made)
    if not (out / COMPLETE_MARKER).exists():
        raise UserError(
            f"{out}: could not store the generated dataset there (no {COMPLETE_MARKER} after the "
            "write); check that the directory is writable, or set AMDAHL_DATA_DIR elsewhere"
        )
    return out


def generate_code(workload: Workload) -> str:
    """A hash of the source of the workload's `generate` (the class that defines it), or of
    its qualified name where no source is found (a class made at run time)."""
    owner = next(c for c in type(workload).__mro__ if "generate" in vars(c))
    try:
        text = inspect.getsource(owner.generate)
    except (OSError, TypeError):
        text = f"{owner.__module__}.{owner.__qualname__}.generate"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _note_older_copies(cache: Path, name: str, split: str, identity: list) -> None:
    """Say so where the same rows were generated before by another `generate`."""
    for copy in cached_datasets(cache):
        made = copy.made
        if [made.get(k) for k in ("name", "data_key", "split", "seed")] == identity:
            _log.warning(
                "%s %s: generate() changed since %s was written; generating the rows again "
                "(`platform data clear` removes the old copy)",
                name,
                split,
                copy.path,
            )
            return


@dataclass(frozen=True)
class CachedDataset:
    """One generated copy in the cache: where, what made it, how large."""

    path: Path
    made: dict[str, Any]
    bytes: int


def cached_datasets(cache: Path = DEFAULT_CACHE) -> list[CachedDataset]:
    """The generated copies in `cache`, oldest first (those amdahl wrote: with their
    COMPLETE_MARKER; copies written before SOURCE_FILE existed record nothing of their making)."""
    out = []
    for d in sorted(cache.glob("*/" + COMPLETE_MARKER)) if cache.is_dir() else []:
        path = d.parent
        try:
            made = json.loads((path / SOURCE_FILE).read_text())
        except (OSError, ValueError):
            made = {}
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        out.append(CachedDataset(path, made, size))
    return sorted(out, key=lambda c: c.path.stat().st_mtime)


def clear_datasets(cache: Path = DEFAULT_CACHE, name: str | None = None) -> list[Path]:
    """Remove the generated copies in `cache` (of workload `name` only, where given: its
    recorded name, or for a copy older than SOURCE_FILE its directory's `<name>-` prefix);
    returns what was removed. Converted data sets (`platform data fashion-mnist`: train/ and
    val/ one level deeper) are not generated copies and stay."""
    removed = []
    for copy in cached_datasets(cache):
        mine = copy.made.get("name") == name or (
            not copy.made and copy.path.name.startswith(f"{name}-")
        )
        if name is None or mine:
            shutil.rmtree(copy.path)
            removed.append(copy.path)
    return removed


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
    if is_uri(source):
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


def write_parquet_dir(
    columns: dict[str, np.ndarray], out: Path, made: dict[str, Any] | None = None
) -> None:
    """Columns -> `out/part-*.parquet` and its COMPLETE_MARKER (and `made`, what generated them,
    as SOURCE_FILE), written aside and renamed into place (a directory appears whole or not at
    all)."""
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    table = pa.table({k: arrow_column(v) for k, v in columns.items()})
    for i, start in enumerate(range(0, max(len(table), 1), _ROWS_PER_FILE)):
        pq.write_table(table.slice(start, _ROWS_PER_FILE), tmp / f"part-{i:05d}.parquet")
    if made is not None:
        (tmp / SOURCE_FILE).write_text(json.dumps(made, sort_keys=True, default=str))
    (tmp / COMPLETE_MARKER).touch()
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


def arrow_column(values: np.ndarray) -> pa.Array:
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
    if is_uri(path):
        return path
    import ray

    return ray.put(read_table(path))


def _table(source: Any) -> pa.Table:
    if isinstance(source, str):
        return read_table(source)
    import ray

    return ray.get(source)


def is_uri(path: str) -> bool:
    """Whether `path` is a URI (s3://, gs://, ...), which every node opens itself."""
    return "://" in path


def table_columns(table: pa.Table) -> dict[str, np.ndarray]:
    """Arrow -> numpy the way Ray Data's numpy batches look: binary as an object array of
    bytes, fixed-size lists as (rows, width) arrays."""
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        chunks = table[name]
        # One chunk (a block, a slice of one) is read in place: combine_chunks copies even
        # then (0.2-0.5 ms per 2048-row MLP block here, on every pass over the block).
        column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            flat = column.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def is_empty_dir(path: Path) -> bool:
    """An empty directory, not a link to one: safe to write a dataset into."""
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None
