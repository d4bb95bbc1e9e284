"""Every key of a row the code produces is a results column: `results.append_rows` keeps only
`COLUMNS`, so a key the harness or the driver adds without a column would vanish from
results.parquet without a word. Rows are built as the code builds them: the worker's
(`rows.results_row`, from the stats of one trial really run in this process, and its
failed variant) and the driver's (`protocol.identity.row_identity` plus the keys of a failed
or skipped row, see driver/pool.py and driver/halving.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from trial_runner import PARAMS, launch_config, run, trial_config

from amdahl.columns import COLUMNS
from amdahl.protocol.identity import row_identity
from amdahl.sweepdir.table import append_rows, read_results
from amdahl.worker.rows import results_row
from workloads.mlp import MLP

STAMP = "2025-01-01T12:00:00+00:00"


def _extra(row: dict[str, Any]) -> set[str]:
    return set(row) - set(COLUMNS)


def _assert_all_columns(row: dict[str, Any], made_by: str) -> None:
    extra = _extra(row)
    assert not extra, (
        f"{made_by} makes keys that are no results column, so append_rows drops them: "
        f"{sorted(extra)}; add them to results.COLUMNS (or stop making them)"
    )


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    """One rank's stats of one trial of the MLP, run in this process on CPU."""
    stats, error, _ = run(MLP(**PARAMS), torch.device("cpu"))
    assert error is None, error
    return stats


def _ranks(stats: dict[str, Any], error: str | None) -> list[dict[str, Any]]:
    """`harness._gather`'s rank dicts for one rank."""
    return [{"stats": stats, "error": error, "node": "n"}]


def _worker_row(stats: dict[str, Any], error: str | None) -> dict[str, Any]:
    trial = trial_config()
    launch = launch_config((trial,))
    cpu = torch.device("cpu")
    return results_row(launch, trial, 0, _ranks(stats, error), time.perf_counter(), STAMP, cpu)


def test_a_measured_row_has_only_results_columns(measured, tmp_path):
    row = _worker_row(measured, None)
    assert row["status"] == "ok" and row["throughput"] > 0  # a real measurement
    _assert_all_columns(row, "rows.results_row (a measured trial)")
    # and every value survives the table: nothing of the row is dropped on the way
    append_rows(tmp_path, [row])
    stored = read_results(tmp_path).to_pylist()[0]
    assert {k: stored[k] for k in row} == pytest.approx(row)


def test_a_failed_worker_row_has_only_results_columns():
    row = _worker_row({}, "oom: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert row["status"] == "oom"
    _assert_all_columns(row, "rows.results_row (a failed trial)")


@pytest.mark.parametrize(
    "made_by, extra",
    [
        ("run.py's failed row", {"status": "failed", "error": "failed: RuntimeError: boom"}),
        ("run.py's skipped row", {"wall_s": 0.0, "status": "skipped", "error": "pruned"}),
    ],
)
def test_the_drivers_rows_have_only_results_columns(made_by, extra):
    trial = trial_config()
    row = {**row_identity(launch_config((trial,)), trial, 0), **extra}
    _assert_all_columns(row, made_by)


def test_the_check_names_a_key_that_is_no_column():
    with pytest.raises(AssertionError, match="'not_a_column'"):
        _assert_all_columns({"trial_id": "t", "not_a_column": 1}, "a test")


def test_started_at_has_milliseconds_and_gives_the_mlflow_start_time_to_the_millisecond():
    """Trials of one worker group start within a second of each other: a whole-second stamp
    left their MLflow child runs (ordered by start time) in no defined order."""
    from amdahl.track.child_run import trial_start_ms

    trial = trial_config()
    first = row_identity(launch_config((trial,)), trial, 0)["started_at"]
    time.sleep(0.01)
    second = row_identity(launch_config((trial,)), trial, 0)["started_at"]
    assert len(first.split(".")[1].split("+")[0]) == 3  # "...T12:00:00.123+00:00"
    assert trial_start_ms({"started_at": second}) > trial_start_ms({"started_at": first})
