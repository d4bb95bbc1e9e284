"""The driver's work items and what the queue answers: one trial repeat (or a calibration) per
item, keyed like its results row. The driver puts items in its work queue
(driver/work_queue.py); rank 0 of a launch leases them, and answers each with a row.
"""

from __future__ import annotations

from dataclasses import dataclass

from amdahl.errors import UserError

#: What `WorkQueue.lease` answers when a launch has no item now but may get one (the driver is
#: deciding the next rung, or the item is another shape's), and when it will never get one.
WAIT = "wait"
CLOSED = "closed"
#: The key under which a row event carries the ranks' profiler traces ({rank: gzip bytes},
#: `WorkQueue.attach`); the driver takes it out before the row is written (driver/traces.py).
TRACES = "_traces"


@dataclass(frozen=True)
class WorkItem:
    """One trial repeat for one launch. Small on purpose: rank 0 broadcasts it to its group
    through Ray Train's synchronisation actor; the worker finds the trial in its LaunchConfig."""

    key: str
    launch_id: str
    trial_id: str
    repeat: int
    #: search: halving: the rung, whose length `steps` is (train.steps, or target.max_steps in
    #: time-to-target mode); None in a grid sweep, which runs train.steps.
    rung: int | None = None
    steps: int | None = None
    #: A rung before the last only ranks: no validation pass, no exposed-communication passes.
    ranking_only: bool = False
    #: "trial", or "calibrate": the whole group measures the all-reduce (`message_sizes` up to
    #: `max_bytes`) and one worker's peaks (worker/calibration_measurement.py); its answer is
    #: that.
    kind: str = "trial"
    max_bytes: int | None = None
    #: search: halving continues a promoted configuration's trial instead of starting it again
    #: (worker/resident.py): `keep` asks the ranks to keep this item's trial for the next rung,
    #: `continues` names the earlier item (its key) whose kept trial this one goes on with.
    keep: bool = False
    continues: str | None = None
    #: why a promoted configuration starts fresh although `search.continue_rungs` is on (one
    #: that is never kept: driver.measurement.never_continues); the row's restart_reason.
    fresh_because: str | None = None
    #: a search's compiled configuration compiles into caches of its own, kept for its later
    #: rungs (worker/compile_dirs.py)
    own_compile_caches: bool = False


def item_key(trial_id: str, repeat: int, rung: int | None) -> str:
    """A run's key: the results row's key (trial id, repeat, rung) as one string."""
    return f"{trial_id}/{repeat}/{'-' if rung is None else rung}"


def message_sizes(max_bytes: int) -> list[int]:
    """All-reduce message sizes a calibration measures, 4 B to `max_bytes`: 4 B and powers of
    16 below 1 MiB (latency: the fit reads it off a median of a few small sizes,
    analysis/alphabeta.py), every power of 2 from 1 MiB (the bandwidth fit's range), and
    `max_bytes` itself, rounded down to whole float32s."""
    if max_bytes < 16:
        raise UserError(f"--max-bytes {max_bytes}: needs at least 16 (two message sizes)")
    sizes = [4 * 16**k for k in range(5) if 4 * 16**k < min(2**20, max_bytes)]
    sizes += [2**k for k in range(20, 64) if 2**k <= max_bytes]
    top = max_bytes // 4 * 4
    return sorted(set(sizes) | {top})
