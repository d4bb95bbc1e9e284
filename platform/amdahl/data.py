"""The input pipeline: workload rows stored once as parquet, read and fed by Ray Data.

Synthetic rows are written once per (workload, params, seed) into a cache directory and reused by
every trial and sweep that asks for the same data. The sweep driver reads the parquet with Ray Data
once (read tasks sized to the CPUs the plan keeps for data) and materialises it in the object
store, so every epoch of every trial of every launch streams from memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from amdahl.workload import Workload

if TYPE_CHECKING:
    import torch

#: Where generated datasets live; AMDAHL_DATA_DIR overrides.
DEFAULT_CACHE = Path(os.environ.get("AMDAHL_DATA_DIR", Path.home() / ".cache" / "amdahl" / "data"))
_ROWS_PER_FILE = 4096


def stored_dataset(
    workload: Workload, name: str, split: str, seed: int, cache: Path = DEFAULT_CACHE
) -> Path:
    """Directory of parquet shards for this workload's split; generated on first use only."""
    key = hashlib.sha1(
        json.dumps([name, workload.params, split, seed], sort_keys=True, default=str).encode()
    ).hexdigest()[:12]
    out = cache / f"{name}-{split}-{key}"
    if (out / "_COMPLETE").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    columns = workload.generate(split, workload.rows(split), seed)
    table = pa.table({k: _arrow_column(v) for k, v in columns.items()})
    for i, start in enumerate(range(0, len(table), _ROWS_PER_FILE)):
        pq.write_table(table.slice(start, _ROWS_PER_FILE), tmp / f"part-{i:05d}.parquet")
    (tmp / "_COMPLETE").touch()
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: theirs is identical
        pass
    return out


def ray_dataset(path: str | Path, cpus_per_read_task: float) -> Any:
    """A materialised Ray Dataset of the stored rows (read tasks sized to the plan's data CPUs)."""
    import ray.data

    ds = ray.data.read_parquet(str(path), num_cpus=cpus_per_read_task)
    return ds.materialize()


def _arrow_column(values: np.ndarray) -> pa.Array:
    """1-D columns as plain arrays, 2-D as fixed-size lists (Ray Data reads them as tensors)."""
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, int(np.prod(values.shape[1:])))


def worker_batches(
    shard: Any, batch_size: int, prefetch: int, device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless stream of per-rank batches: epochs of the Ray Data shard, one after another.

    On GPU, `iter_torch_batches(device=...)` overlaps the host-to-device copy with compute.
    """
    while True:
        yielded = False
        for batch in shard.iter_torch_batches(
            batch_size=batch_size, prefetch_batches=prefetch, drop_last=True, device=device
        ):
            yielded = True
            yield batch
        if not yielded:
            raise RuntimeError(
                f"the data shard holds fewer than batch_size={batch_size} rows; "
                "raise params.train_rows or lower the batch size"
            )
