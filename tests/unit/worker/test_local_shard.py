"""A static ray_data shard read as the Arrow tables the rank holds (`input.local_shard`,
`LocalShard`): the same rows in the same order as Ray Data's own iterator over that shard (the
independent reference), through a real local Ray; batches cut across table ends; the fallback
to Ray Data's iterator for a shard too large to hold."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest
import torch

from amdahl.data.prepare import rank_shards, repeat_to_cover
from amdahl.data.storage import arrow_column
from amdahl.worker import input as worker_input
from amdahl.worker.input import LocalShard, host_batches, local_shard


def _table(start: int, stop: int) -> pa.Table:
    """Rows start..stop-1: a (rows, 2) fixed-size-list column, as stored rows are, and labels."""
    x = np.arange(start, stop, dtype=np.float32).reshape(-1, 1).repeat(2, axis=1)
    return pa.table({"x": arrow_column(x), "y": np.arange(start, stop, dtype=np.int64)})


def _ray_shards(world: int, rows_per_pass: int) -> list:
    """Shards made as a sweep makes them: uneven blocks, an equal split, repeated to cover."""
    import ray.data

    cuts = [0, 70, 75, 200, 333]
    base = ray.data.from_blocks([_table(a, b) for a, b in zip(cuts, cuts[1:], strict=False)])
    return [repeat_to_cover(s, rows_per_pass) for s in rank_shards(base, world)]


@pytest.mark.parametrize("world", [1, 2])
def test_a_local_shard_holds_the_rows_ray_data_reads_in_its_order(local_ray, world):
    for shard in _ray_shards(world, rows_per_pass=700):
        held = local_shard(shard)
        assert isinstance(held, LocalShard)  # fetch_s: tests/integration/test_multinode.py
        reference = pa.concat_tables(shard.iter_batches(batch_size=None, batch_format="pyarrow"))
        assert held.rows == len(reference) == shard.count()
        assert pa.concat_tables(held.tables).equals(reference)


def test_batches_run_through_the_tables_in_order_and_around_again(monkeypatch):
    joins: list[int] = []  # rows of each joined buffer, one per column

    def buffer(shape, dtype, pin_memory):
        joins.append(shape[0])
        return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr("amdahl.worker.input._host_buffer", buffer)
    converted: list[int] = []  # rows of each table converted to tensors
    convert = worker_input.torch_columns
    monkeypatch.setattr(
        worker_input, "torch_columns", lambda t, pin: converted.append(len(t)) or convert(t, pin)
    )
    shard = LocalShard([_table(0, 10), _table(10, 13), _table(13, 30)], fetch_s=0.0)
    batches = host_batches(shard, batch_size=4, prefetch=4, pin=False)
    got, joined = [], []
    for _ in range(9):  # 36 rows: the 30 rows, then around again
        got.append(next(batches))
        joined.append(len(joins) // 2)
    expected = np.tile(np.arange(30), 2)[:36].reshape(9, 4)
    assert [b["y"].tolist() for b in got] == expected.tolist()
    assert [b["x"][:, 1].tolist() for b in got] == expected.astype(np.float32).tolist()
    assert all(b["x"].shape == (4, 2) and b["x"].dtype == torch.float32 for b in got)
    # Views inside a table; joined copies only for the batches spanning tables: rows 8-11,
    # 12-15 and 28-1 (across the end of the shard).
    assert joined == [0, 0, 1, 2, 2, 2, 2, 3, 3]
    assert set(joins) == {4}
    assert converted == [10, 3, 17]  # on CPU each table's views are made once, then reused


def test_rebatched_rows_follow_the_chunks_across_calls_sizes_and_empty_chunks(monkeypatch):
    """The reference: the chunks' rows one after another. A later `batches` call (a launch's
    next trial) goes on where the last one stopped, at its own batch size. Batches that fit
    their chunk are views: chunks of whole batches are never joined."""
    sizes = [5, 0, 3, 7, 1]
    chunks, start = [], 0
    for n in sizes * 4:
        chunks.append({"y": torch.arange(start, start + n)})
        start += n
    batcher = worker_input.Rebatcher(iter(chunks), pin=False)
    got = []
    for batch_size, count in ((4, 5), (6, 3), (1, 4), (7, 2)):
        batches = batcher.batches(batch_size)
        got += [next(batches)["y"].tolist() for _ in range(count)]
    assert [len(b) for b in got] == [4] * 5 + [6] * 3 + [1] * 4 + [7] * 2
    assert sum(got, []) == list(range(sum(len(b) for b in got)))

    joins: list[tuple[int, ...]] = []
    monkeypatch.setattr(
        "amdahl.worker.input._host_buffer",
        lambda shape, dtype, pin: joins.append(shape) or torch.empty(shape, dtype=dtype),
    )
    whole = [{"y": torch.arange(i, i + 4)} for i in range(0, 40, 4)]
    batches = worker_input.Rebatcher(iter(whole), pin=False).batches(4)
    assert [next(batches)["y"].tolist() for _ in range(10)] == [c["y"].tolist() for c in whole]
    assert joins == []


def test_a_shard_smaller_than_a_batch_is_refused():
    shard = LocalShard([_table(0, 3)], fetch_s=0.0)
    with pytest.raises(RuntimeError, match="fewer than batch_size=4"):
        next(host_batches(shard, batch_size=4, prefetch=0, pin=False))


def test_tables_converted_ahead_match_those_converted_inline_and_the_thread_stops():
    tables = [_table(a, a + 4) for a in range(0, 40, 4)]
    ahead = worker_input._converted_ahead(iter(tables), ahead=3, pin=False)
    got = [next(ahead) for _ in range(8)]
    assert any(t.name.startswith("amdahl-pin") for t in threading.enumerate())
    ahead.close()
    assert not any(t.name.startswith("amdahl-pin") for t in threading.enumerate())
    inline = [worker_input.torch_columns(t, pin=False) for t in tables[:8]]
    for mine, theirs in zip(got, inline, strict=True):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_shard_too_large_to_hold_is_read_through_ray_datas_iterator(local_ray, monkeypatch):
    monkeypatch.setattr(worker_input, "_MAX_PINNED_SHARE", 0.0)
    (shard,) = _ray_shards(1, rows_per_pass=700)
    source = local_shard(shard)
    assert not isinstance(source, LocalShard)
    # The reference: the rows Ray Data's own iterator reads, one pass after another.
    one_pass = pa.concat_tables(shard.iter_batches(batch_size=None, batch_format="pyarrow"))
    rows = len(one_pass)
    assert rows % 10  # a pass's last batch runs into the next pass
    batches = host_batches(source, batch_size=10, prefetch=2, pin=False)
    got = [next(batches) for _ in range(rows // 10 + 2)]
    batches.close()
    expected = np.tile(one_pass["y"].to_numpy(), 2)[: 10 * len(got)].reshape(-1, 10)
    assert [b["y"].tolist() for b in got] == expected.tolist()
    assert [b["x"][:, 0].tolist() for b in got] == expected.astype(np.float32).tolist()
    with pytest.raises(RuntimeError, match=f"fewer than batch_size={rows + 1}"):
        next(host_batches(source, batch_size=rows + 1, prefetch=0, pin=False))


def test_a_one_chunk_column_is_read_in_place_and_a_chunked_one_joined():
    """`table_columns` reads a block's (or a slice's) one-chunk columns in place: a copy there
    is paid on every pass over the block. Columns of several chunks are joined (a copy)."""
    from amdahl.data.storage import table_columns

    table = _table(0, 6).slice(2, 3)
    columns = table_columns(table)
    assert columns["x"].tolist() == [[2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]
    assert columns["y"].tolist() == [2, 3, 4]
    x_values = table["x"].chunk(0).values.buffers()[1].address
    y_values = table["y"].chunk(0).buffers()[1].address
    assert columns["x"].ctypes.data == x_values + 2 * 2 * 4  # row 2 of (rows, 2) float32
    assert columns["y"].ctypes.data == y_values + 2 * 8  # row 2 of int64
    joined = table_columns(pa.concat_tables([_table(0, 2), _table(2, 4)]))
    assert joined["y"].tolist() == [0, 1, 2, 3] and joined["x"].shape == (4, 2)
