"""The results table: one row per trial repeat in `<sweep dir>/results.parquet`.

It is the source of truth (MLflow is a mirror, the report a view). The driver is its only writer
and replaces the file atomically after every row, so a crash never damages earlier rows.
Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from amdahl.columns import COLUMNS, SCHEMA, SCHEMA_TAG
from amdahl.errors import UserError
from amdahl.files import write_private
from amdahl.sweepdir.layout import RESULTS_FILE


def row_key(row: dict[str, Any]) -> tuple[str, int, int | None]:
    """What makes a row unique: a later row with the same key replaces it (a retried trial)."""
    return row["trial_id"], row["repeat"], row.get("rung")


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
        # Through one open handle: given a path, pyarrow takes the size from one stat and reads
        # from a second open, so a file replaced in between (the driver appends while `platform
        # report` or a test reads) is read at the wrong offsets.
        with open(path, "rb") as f:
            table = pq.read_table(f)
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
