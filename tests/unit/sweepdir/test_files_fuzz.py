"""Property-based tests of the readers of files amdahl finds on disk: Fashion-MNIST's IDX files
(`platform data fashion-mnist`) and, in a sweep directory that is resumed, reported or synced,
results.parquet, plan.json and tracking.json. Random, truncated or corrupted contents are read
or refused with a UserError naming the file, never another exception."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_rows import row, write_sweep

from amdahl.columns import COLUMNS, SCHEMA_TAG
from amdahl.data.fashion_mnist import read_idx
from amdahl.errors import UserError
from amdahl.report import build_report
from amdahl.report.inputs import load_inputs
from amdahl.report.render_text import to_markdown
from amdahl.spec.load import validate_spec
from amdahl.sweepdir.layout import PLAN_FILE, RESULTS_FILE, TRACKING_FILE
from amdahl.sweepdir.table import read_results
from amdahl.track.state import load_state
from amdahl.track.tracker import Tracker

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def damaged(draw: st.DrawFn, good: bytes) -> bytes:
    """`good` truncated, with bytes overwritten, or with bytes spliced in; or random bytes."""
    how = draw(st.sampled_from(["truncate", "overwrite", "splice", "random"]))
    if how == "random":
        return draw(st.binary(max_size=300))
    if how == "truncate":
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]
    out = bytearray(good)
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(out)))
        piece = draw(st.binary(min_size=1, max_size=6))
        out[at : at + (len(piece) if how == "overwrite" else 0)] = piece
    return bytes(out)


# --------------------------------------------------------------------------- IDX


def _idx(array: np.ndarray, code: int = 0x08) -> bytes:
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


GOOD_IDX = [
    _idx(np.arange(2 * 5 * 4, dtype=np.uint8).reshape(2, 5, 4)),
    _idx(np.array([3, 1, 4], dtype=np.uint8)),
    _idx(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3), 0x0D),
]


@st.composite
def idx_files(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, bytes): a good file damaged, or a header of random sizes over few bytes."""
    if draw(st.booleans()):
        blob = draw(damaged(draw(st.sampled_from(GOOD_IDX))))
    else:
        ndim = draw(st.integers(0, 6))
        dims = draw(st.lists(st.integers(0, 2**32 - 1), min_size=ndim, max_size=ndim))
        code = draw(st.sampled_from([0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0xFF]))
        blob = bytes([0, 0, code, ndim]) + struct.pack(f">{ndim}I", *dims)
        blob += draw(st.binary(max_size=64))
    if draw(st.booleans()):
        return "f.gz", gzip.compress(blob) if draw(st.booleans()) else draw(damaged(blob))
    return "f", blob


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("files-fuzz")


@FUZZ
@given(file=idx_files())
def test_any_idx_file_is_read_or_one_user_error(scratch, file):
    name, blob = file
    path = scratch / name
    path.write_bytes(blob)
    try:
        array = read_idx(path)
    except UserError as e:
        assert str(path) in str(e)
        return
    assert isinstance(array, np.ndarray)


# --------------------------------------------------------------------------- sweep directory

SPEC = validate_spec({"name": "t", "workload": "mlp"})
ROWS = [
    row(1, 128),
    row(2, 128, throughput=1800.0),
    {**row(1, 512), "status": "failed", "error": "boom", "throughput": None},
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweep") / "t-20250101T000000Z", ROWS)


@pytest.fixture(scope="module")
def good_results(sweep) -> bytes:
    return (sweep / RESULTS_FILE).read_bytes()


def _arrow_columns() -> dict[str, tuple[pa.DataType, st.SearchStrategy]]:
    return {
        "string": (pa.string(), st.text(max_size=4) | st.sampled_from(["12", "1.5", "ok"])),
        "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
        "float64": (pa.float64(), st.floats()),
        "bool": (pa.bool_(), st.booleans()),
        "list": (pa.list_(pa.int64()), st.lists(st.integers(-5, 5), max_size=3)),
        "struct": (
            pa.struct([("a", pa.int64())]),
            st.fixed_dictionaries({"a": st.integers(-9, 9)}),
        ),
        "binary": (pa.binary(), st.binary(max_size=4)),
        "not utf-8": (pa.binary(), st.sampled_from([b"\x80", b"ok\xff", b"\xc3"])),
        "null": (pa.null(), st.none()),
    }


@st.composite
def foreign_tables(draw: st.DrawFn) -> pa.Table:
    """A parquet table with amdahl's tag (usually) and columns of any type, some repeated."""
    kinds = _arrow_columns()
    n = draw(st.integers(0, 3))
    names = draw(
        st.lists(st.sampled_from([*COLUMNS, "extra"]), max_size=8)
        | st.just(["trial_id", "trial_id"])
    )
    arrays = []
    for _ in names:
        typ, values = kinds[draw(st.sampled_from(sorted(kinds)))]
        array = pa.array(draw(st.lists(values | st.none(), min_size=n, max_size=n)), typ)
        if typ == pa.binary() and draw(st.booleans()):
            array = array.view(pa.string())  # a string column that is not valid UTF-8
        arrays.append(array)
    table = pa.Table.from_arrays(arrays, names=names) if names else pa.table({})
    if draw(st.integers(0, 4)):
        table = table.replace_schema_metadata({b"amdahl": SCHEMA_TAG})
    return table


def _read_sweep(d: Path) -> None:
    """What resume, report and sync read of results.parquet; UserError names the file."""
    from amdahl.sweepdir.resume import finished_trials

    try:
        table = read_results(d)
        finished_trials(d, retry_failed=True)
        load_inputs(d)
    except UserError as e:
        assert str(d) in str(e)
        return
    assert isinstance(table, pa.Table)


@FUZZ
@given(data=st.data())
def test_any_results_file_is_read_or_one_user_error(tmp_path_factory, good_results, data):
    d = tmp_path_factory.mktemp("r")
    if data.draw(st.booleans()):
        (d / RESULTS_FILE).write_bytes(data.draw(damaged(good_results)))
    else:
        pq.write_table(data.draw(foreign_tables()), d / RESULTS_FILE)
    _read_sweep(d)


def test_a_column_of_the_wrong_type_names_the_file_and_column(tmp_path):
    table = pa.table({"trial_id": ["a"], "devices": ["two"]})
    pq.write_table(table.replace_schema_metadata({b"amdahl": SCHEMA_TAG}), tmp_path / RESULTS_FILE)
    with pytest.raises(UserError) as info:
        read_results(tmp_path)
    message = str(info.value)
    assert f"{tmp_path / RESULTS_FILE}: column 'devices' (string) does not hold valid" in message
    assert "start a new sweep directory" in message
    text = pa.array([b"\x80abc"], pa.binary()).view(pa.string())  # not UTF-8
    pq.write_table(
        pa.table({"trial_id": text}).replace_schema_metadata({b"amdahl": SCHEMA_TAG}),
        tmp_path / RESULTS_FILE,
    )
    with pytest.raises(UserError, match="column 'trial_id' .*Invalid UTF8"):
        read_results(tmp_path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
plan_like = st.fixed_dictionaries(
    {},
    optional={
        "trials": json_values
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={"label": json_values, "trial_id": json_values, "refused": json_values},
            ),
            max_size=4,
        )
    },
)


@st.composite
def json_files(draw: st.DrawFn, structured: st.SearchStrategy) -> bytes:
    value = draw(json_values | structured)
    text = json.dumps(value).encode()
    how = draw(st.sampled_from(["as is", "damaged", "deep"]))
    if how == "damaged":
        return draw(damaged(text))
    if how == "deep":
        return b"[" * draw(st.integers(1000, 100_000))
    return text


@FUZZ
@given(blob=json_files(plan_like))
def test_any_plan_file_still_gives_a_report(sweep, blob):
    (sweep / PLAN_FILE).write_bytes(blob)
    try:
        report = build_report(sweep)
    except UserError as e:
        assert PLAN_FILE in str(e)
        return
    assert "Failed, out-of-memory, diverged and refused trials" in to_markdown(report)


def test_a_refused_reason_that_is_not_text_is_shown_not_fatal(sweep):
    trials = [{"label": "d9 b1", "refused": {"why": ["no", "gpu"]}}, {"refused": 7}]
    (sweep / PLAN_FILE).write_text(json.dumps({"trials": trials}))
    markdown = to_markdown(build_report(sweep))
    assert '| d9 b1 | refused | 1 | {"why": \\["no", "gpu"\\]} |' in markdown.replace("  ", " ")


state_like = st.fixed_dictionaries(
    {},
    optional={
        "version": st.integers(0, 3) | json_values,
        "stores": json_values,
        "parent_run_id": json_values,
        "logged": json_values
        | st.dictionaries(
            st.text(max_size=6),
            st.fixed_dictionaries({}, optional={"run_id": json_values, "status": json_values}),
        ),
    },
)


def _tracking_state(blob: bytes, sweep: Path) -> Any:
    path = sweep / TRACKING_FILE
    path.write_bytes(blob)
    try:
        state = load_state(path)
        Tracker(SPEC, sweep, enabled=False)
    except UserError as e:
        assert str(path) in str(e)
        return None
    finally:
        path.unlink()
    return state


@FUZZ
@given(blob=json_files(state_like))
def test_any_tracking_state_is_read_or_one_user_error(sweep, blob):
    _tracking_state(blob, sweep)
