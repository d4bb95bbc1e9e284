"""The profiler pass (worker/profile.py, run by worker/trial.py after the measured window): a real
two-rank DDP trial on gloo whose ranks each return a compressed
Chrome trace of exactly `train.profile_steps` steps holding gloo's all-reduces, with the pass's
seconds apart from the window; then the trace's way to the driver: the work queue carries it
with the row, and the driver writes it into the sweep directory and fills the overlap columns.
"""

from __future__ import annotations

import os
import pickle
import socket
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trial_runner import PARAMS, TRAIN, launch_config, one_rank_group, run, trial_config

from amdahl.analysis.overlap import rank_figures, read_trace, trace_figures
from amdahl.columns import COLUMNS
from amdahl.data.storage import arrow_column
from amdahl.driver.traces import keep_traces
from amdahl.driver.work_queue import WorkQueue
from amdahl.protocol.items import TRACES, WorkItem
from amdahl.protocol.queue import Answered
from amdahl.sweepdir.layout import SweepDir
from amdahl.worker.input import LoaderSource, validation_rows
from amdahl.worker.trial import Placement, TrialRun, run_trial_guarded
from workloads.mlp import MLP

PROFILE_STEPS = 2
WARMUP = TRAIN["warmup_steps"]


# --------------------------------------------------------------------------- a real DDP trial


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: str, profile_steps: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        workload = MLP(**PARAMS)
        rows = workload.generate("train", PARAMS["train_rows"], seed=rank)
        table = pa.table({k: arrow_column(v) for k, v in rows.items()})
        source = LoaderSource(table, workload, rank=rank, world=2, workers=0)
        val = validation_rows(workload, None, seed=0)
        trial = trial_config(devices=2, sync="ddp")
        launch = launch_config((trial,), profile_steps=profile_steps)
        where = Placement(torch.device("cpu"), rank, 2)
        result = run_trial_guarded(TrialRun(workload, trial, launch, source, val, where))
        Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)  # torch 2.13 (CPU) may abort in static destructors after gloo (test_sync.py)


def _run(tmp: Path, profile_steps: int) -> list[dict[str, Any]]:
    mp.spawn(_rank, args=(_free_port(), str(tmp), profile_steps), nprocs=2, join=True)
    out = []
    for r in (0, 1):
        stats, error, _ = pickle.loads((tmp / f"rank{r}.pkl").read_bytes())
        assert error is None, error
        out.append(stats)
    return out


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> list[dict[str, Any]]:
    return _run(tmp_path_factory.mktemp("profiled"), PROFILE_STEPS)


def test_every_rank_returns_its_trace(profiled):
    for rank, stats in enumerate(profiled):
        assert stats["trace_error"] is None
        assert stats["trace"][:2] == b"\x1f\x8b"  # gzip
        trace = read_trace(stats["trace"])
        assert trace["distributedInfo"]["rank"] == rank
        fig = rank_figures(trace, rank)
        assert fig.steps == PROFILE_STEPS
        assert fig.comm_s > 0  # gloo's all-reduces of DDP's buckets are in it
        assert 0 <= fig.overlapped_s <= fig.comm_s
        # the pass is its own seconds, not the window's: beside its 8 steps and their input
        # waits (every step is in the history), the window holds less than half the pass
        history = stats["history"]
        assert stats["measured_steps"] == 8 and len(history["step"]) == 8 + WARMUP
        measured = zip(
            history["step_time_s"][WARMUP:], history["data_wait_s"][WARMUP:], strict=True
        )
        outside_steps = stats["window_s"] - sum(t + w for t, w in measured)
        assert 0 < stats["profile_s"] and outside_steps < stats["profile_s"] / 2


def test_a_one_device_trial_runs_no_pass():
    """Neither the profiler pass nor the exposed-communication probe: one rank has no
    collective to trace or hide."""
    one_rank_group("gloo")
    stats, error, _ = run(MLP(**PARAMS), torch.device("cpu"), sync="ddp")
    assert error is None, error
    assert stats["profile_s"] is None and "trace" not in stats
    assert stats["comm_s"] is None  # a number (the one-rank all-reduce's cost) before


# --------------------------------------------------------------------------- to the driver


def test_the_queue_carries_the_traces_to_the_driver(profiled, tmp_path):
    queue = WorkQueue()
    item = WorkItem("t/0/-", "launch", "t", 0)
    queue.put([item])
    assert queue.lease("launch") == item
    for rank, stats in enumerate(profiled):
        queue.attach(item.key, rank, stats["trace"])
    row = {"trial_id": "t", "repeat": 0, "rung": None, "status": "ok"}
    queue.ack(item.key, row)
    [event] = queue.drain_events()
    answer = event.row
    assert isinstance(event, Answered) and set(answer[TRACES]) == {0, 1}

    kept = keep_traces(tmp_path, answer)
    assert TRACES not in kept and set(kept) <= set(COLUMNS)  # nothing but results columns
    folder = SweepDir(tmp_path).trace_dir("t", 0, None)
    assert kept["trace_dir"] == folder.relative_to(tmp_path).as_posix()
    for rank, stats in enumerate(profiled):
        assert (folder / SweepDir.trace_file(rank)).read_bytes() == stats["trace"]
    # the row's figures are the two ranks' traces' own, as the workers recorded them (a driver
    # that kept one rank's, or swapped them, would differ)
    own = trace_figures(
        [rank_figures(read_trace(stats["trace"]), rank) for rank, stats in enumerate(profiled)]
    )
    assert kept["comm_trace_s"] == pytest.approx(own.comm_trace_s) and own.comm_trace_s > 0
    assert kept["comm_overlap"] == pytest.approx(own.comm_overlap)
    assert (kept["straggler_rank"], kept["straggler_s"]) == (own.straggler_rank, own.straggler_s)


def test_a_redelivered_item_drops_the_traces_of_its_lost_delivery():
    queue = WorkQueue()
    item = WorkItem("t/0/-", "launch", "t", 0)
    queue.put([item])
    queue.enter("launch")
    queue.lease("launch")
    queue.attach(item.key, 1, b"stale")  # then the worker group dies; Ray Train restarts it
    queue.enter("launch")  # hands the item out again
    assert queue.lease("launch") == item
    queue.ack(item.key, {"status": "ok"})
    rows = [e.row for e in queue.drain_events() if isinstance(e, Answered)]
    assert rows == [{"status": "ok"}]


def test_a_failed_item_drops_its_traces():
    queue = WorkQueue()
    item = WorkItem("t/0/-", "launch", "t", 0)
    queue.put([item])
    queue.lease("launch")
    queue.attach(item.key, 1, b"stale")
    queue.fail(item.key, "failed: boom")
    assert queue._traces == {}


def test_a_damaged_trace_costs_its_columns_not_the_row(tmp_path):
    row = {"trial_id": "t", "repeat": 1, "rung": 2, "status": "ok", TRACES: {0: b"\x1f\x8bnot"}}
    kept = keep_traces(tmp_path, row)
    assert kept["comm_overlap"] is None and kept["trace_dir"] == "traces/t/1-rung2"
