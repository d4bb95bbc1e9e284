"""The results table: append keeps earlier rows, foreign or broken files get a clear error."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from amdahl.columns import COLUMNS
from amdahl.errors import UserError
from amdahl.sweepdir.layout import RESULTS_FILE
from amdahl.sweepdir.table import append_rows, read_results


def _row(trial_id: str, repeat: int = 0, **extra):
    return {
        "sweep": "t",
        "trial_id": trial_id,
        "repeat": repeat,
        "devices": 1,
        "status": "ok",
        "throughput": 100.0,
        **extra,
    }


def test_missing_table_is_empty_with_every_column(tmp_path):
    table = read_results(tmp_path)
    assert table.num_rows == 0
    assert table.column_names == list(COLUMNS)


def test_append_keeps_earlier_rows_and_leaves_no_temp_file(tmp_path):
    append_rows(tmp_path, [_row("a")])
    append_rows(tmp_path, [_row("b"), _row("b", 1, status="failed", error="boom")])
    table = read_results(tmp_path)
    assert table["trial_id"].to_pylist() == ["a", "b", "b"]
    assert table["error"].to_pylist() == [None, None, "boom"]
    assert [p.name for p in tmp_path.iterdir()] == [RESULTS_FILE]


def test_old_tables_without_new_columns_stay_readable(tmp_path):
    append_rows(tmp_path, [_row("a")])
    path = tmp_path / RESULTS_FILE
    old = pq.read_table(path).drop_columns(["val_accuracy", "peak_mem_bytes"])
    pq.write_table(old, path)
    table = read_results(tmp_path)
    assert table["val_accuracy"].to_pylist() == [None]


def test_foreign_and_corrupted_files_are_user_errors(tmp_path):
    pq.write_table(pa.table({"x": [1]}), tmp_path / RESULTS_FILE)
    with pytest.raises(UserError, match="not an amdahl results table"):
        read_results(tmp_path)
    (tmp_path / RESULTS_FILE).write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(UserError, match="not a readable parquet file"):
        read_results(tmp_path)
    with pytest.raises(UserError, match="not a sweep directory"):
        read_results(tmp_path / "nope")


def test_reader_never_sees_a_table_the_writer_is_replacing(tmp_path):
    """`platform report` (or a test) reads while the driver appends. Given a path, pyarrow took
    the size from one stat and read a second open, so a file replaced in between read as
    damaged (CI saw "Couldn't deserialize thrift"); 200 appends made that happen every time."""
    import threading

    append_rows(tmp_path, [_row("seed")])
    errors: list[Exception] = []
    done = threading.Event()

    def read_until_done():
        while not done.is_set():
            try:
                read_results(tmp_path)
            except UserError as e:
                errors.append(e)

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        for i in range(200):
            append_rows(tmp_path, [_row(f"t{i}", error="x" * (i % 50))])
    finally:
        done.set()
        reader.join()
    assert errors == []
    assert read_results(tmp_path).num_rows == 201
