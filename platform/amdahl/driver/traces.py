"""A row's profiler traces, on the driver: written into the sweep directory and read into the
row's overlap columns before the row is recorded (docs/architecture.md, "Traces and overlap").

The ranks' compressed Chrome traces come with the row from the work queue (`WorkQueue.attach`,
under `protocol.items.TRACES`), so a worker on another node needs no shared filesystem; the driver
alone writes them, as it alone writes results.parquet. analysis/overlap.py computes the
columns; a trace that cannot be read costs its columns (a warning), never the row.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from amdahl.analysis.overlap import NO_FIGURES, rank_figures, read_trace, trace_figures
from amdahl.files import private_dir, write_private
from amdahl.protocol.items import TRACES
from amdahl.sweepdir.layout import SweepDir

_log = logging.getLogger(__name__)


def keep_traces(sweep_dir: Path, row: dict[str, Any]) -> dict[str, Any]:
    """`row` without its traces, and with the columns they give (`trace_dir`, `comm_trace_s`,
    `comm_overlap`, `straggler_rank`, `straggler_s`) when it has any."""
    traces: dict[int, bytes] | None = row.pop(TRACES, None)
    if not traces or row.get("status") != "ok":
        return row
    files = SweepDir(sweep_dir)
    folder = files.trace_dir(row["trial_id"], row["repeat"], row.get("rung"))
    try:
        private_dir(folder, exist_ok=True)
        for rank, blob in sorted(traces.items()):
            write_private(folder / files.trace_file(rank), blob)
        row["trace_dir"] = folder.relative_to(files.path).as_posix()
    except OSError as e:
        _log.warning("traces of %s not written: %s", row["trial_id"], e)
    try:
        figures = trace_figures([rank_figures(read_trace(b), r) for r, b in sorted(traces.items())])
    except (ValueError, TypeError, KeyError, OSError, EOFError) as e:  # a damaged trace
        _log.warning("traces of %s unreadable, no overlap figures: %s", row["trial_id"], e)
        figures = NO_FIGURES
    row.update(figures.columns())
    return row
