"""Worker side: a launch's entry point, run inside each Ray Train worker of its worker group.

One launch = one worker group running its trials one after another (worker/trial.py runs one).
Before the first trial each rank reads the validation split, measures its peak FLOP/s and starts
a launch-long input stream; after each trial, rank 0 gathers the per-rank measurements and
reports one results row per trial repeat through `ray.train.report`, with a checkpoint listing
the finished trials so that a restarted worker group resumes after them. Workers never talk to
MLflow.
"""

from __future__ import annotations

import json
import math
import os
import platform as _stdlib_platform
import statistics
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from amdahl.worker.contract import LaunchConfig, TrialConfig
from amdahl.worker.input import train_source, validation_rows
from amdahl.worker.peak import measure_peak_flops
from amdahl.worker.rows import ROW_REPORT_KEY, failure_status, row_identity
from amdahl.worker.training import ProcessPoisoned, process_versions
from amdahl.worker.trial import Placement, run_trial_guarded
from amdahl.worker.worlds import TrialWorlds
from amdahl.workload import Workload, make_workload

_DONE_FILE = "done.json"
_DRAIN_S = 1.0


# --------------------------------------------------------------------------- entry point


def train_launch(loop_config: dict[str, LaunchConfig]) -> None:
    """`train_loop_per_worker` of the launch's TorchTrainer (`train_loop_config` is
    `{"launch": LaunchConfig}`): run every trial, report each row."""
    import ray.train
    import ray.train.torch

    # DDP's constructor imports torch._dynamo (~1 s of CPU here): pay it now, on every rank at
    # once, rather than inside the first timed trial of each rank (a rank first used by a
    # later, larger trial would pay it there).
    import torch._dynamo  # noqa: F401

    entered_unix, entered = time.time(), time.perf_counter()
    launch = loop_config["launch"]
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    worlds = TrialWorlds(rank, ctx.get_world_size(), launch.collective_timeout_s)
    device = ray.train.torch.get_device()
    torch.set_num_threads(launch.resources.torch_threads)
    # The launch's input (stored rows, preprocessing, validation split) is the same for every
    # trial (plan: Workload.input_key); model and loss come from each trial's own params.
    workload = make_workload(launch.workload, launch.trials[0].params)
    shards, val = _before_first_trial(launch, workload, rank, device)

    # A restarted worker group (train.max_failures) resumes after the last reported trial.
    done = set(launch.skip) | _reported_before()
    # Everything alive now lives for the whole launch: keep it out of the collections that
    # each trial's memory reset runs (a full collection of torch's and Ray's ~380k objects
    # took 0.15-0.2 s per trial; a trial's own garbage is still collected).
    import gc

    gc.freeze()
    reported_at = deque([-math.inf, -math.inf], maxlen=2)  # this rank's last two reports
    # Where a launch's start went, in its first row: when this function began (against the
    # driver's clock, the Ray Train start) and its own set-up before the first trial.
    launch_start = {
        "launch_entered_unix_s": entered_unix,
        "launch_setup_s": time.perf_counter() - entered,
    }
    for trial, repeat in launch.schedule():
        if (trial.trial_id, repeat) in done:
            continue
        world = trial.devices
        done.add((trial.trial_id, repeat))
        if not worlds.enter(world):
            _report(None, done)  # an idle rank: wait in the report barrier
            reported_at.append(time.monotonic())
            continue
        if world not in shards:
            shards[world] = train_source(launch, workload, rank, world, device.type == "cuda")
        started = time.perf_counter()
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        where = Placement(device, rank, world)
        own = (
            workload
            if trial.params == workload.params
            else make_workload(launch.workload, trial.params)
        )
        stats, error, kind = run_trial_guarded(own, trial, launch, shards[world], val, where)
        if kind == "poisoned":
            # No collective can run in this process any more: end the worker group; the
            # driver records this trial with the reason and relaunches the rest.
            raise ProcessPoisoned(error.splitlines()[0])
        _wait_for_every_rank(f"{trial.trial_id}/{repeat}", error, world)
        gathered = _gather(stats, error, world)
        row = results_row(launch, trial, repeat, gathered, started, stamp, device)
        row.update(launch_start)
        launch_start = {}
        _report(row if rank == 0 else None, done)
        reported_at.append(time.monotonic())
    # Ray 2.60: if the launch's last rows are still queued for Tune when this function returns,
    # Tune's function trainable can deadlock flushing two of them into its size-1 result queue
    # (seen with trials tens of ms apart). Return only once the row before the last has had
    # _DRAIN_S to reach Tune (rows are collected every 0.25 s): free after a trial that long.
    time.sleep(max(0.0, _DRAIN_S - (time.monotonic() - reported_at[-2])))


def _before_first_trial(
    launch: LaunchConfig, workload: Workload, rank: int, device: torch.device
) -> tuple[dict[int, Any], dict[str, np.ndarray]]:
    """This rank's inputs for the launch: its training input per trial world size (so far only
    a preprocessing launch's stream, started here) and the validation split."""
    shards: dict[int, Any] = {}  # this rank's training input, per trial world size
    val = validation_rows(workload, launch.val_rows, launch.train.seed)
    # The peak FLOP/s (the MFU denominator) of every precision the launch uses, measured once,
    # before any trial's model holds memory (a probe beside a model near the memory limit
    # could turn a trial that fits into an "oom").
    for precision in sorted({t.precision for t in launch.trials}):
        measure_peak_flops(device, precision)

    # A launch whose workload preprocesses streams its input through Ray Train's split: start
    # that pipeline now, after the peak probe (which it would slow), not in the first trial.
    if launch.input == "ray_data" and launch.preprocesses:
        world = launch.resources.workers
        shards[world] = train_source(launch, workload, rank, world, device.type == "cuda")
        shards[world].warm()
    return shards, val


def _report(row: dict[str, Any] | None, done: set[tuple[str, int]]) -> None:
    """Rank 0 reports the row (one JSON field: Tune adds keys of its own, `trial_id` among
    them) with a tiny checkpoint listing the finished trials; other ranks report nothing."""
    import tempfile

    import ray.train

    if row is None:
        ray.train.report({})
        return
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, _DONE_FILE), "w") as f:
            json.dump(sorted(done), f)
        ray.train.report(
            {ROW_REPORT_KEY: json.dumps(row)}, checkpoint=ray.train.Checkpoint.from_directory(tmp)
        )


def _reported_before() -> set[tuple[str, int]]:
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return set()
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, _DONE_FILE)) as f:
            return {(t, r) for t, r in json.load(f)}


# --------------------------------------------------------------------------- results row


#: How long a rank whose trial failed waits for the other ranks to finish theirs.
FAILED_RANK_WAIT_S = 30.0


class RankStranded(RuntimeError):
    """A trial failed on some ranks while others were left inside a collective operation."""


def _wait_for_every_rank(key: str, error: str | None, world: int) -> None:
    """Before the row's collective: make sure no rank is stranded in a training collective.

    An exception on one rank only (an OOM on one GPU, a bad batch) leaves the others waiting in
    the step's all-reduce for a rank that will never join; had the failed rank gone on to the
    next collective, the launch would hang until the process group's timeout (measured: 600 s
    on gloo) and then report a misleading transport error. So every rank checks in at the end
    of each trial through the rendezvous store (no collective), and a failed rank waits at most
    FAILED_RANK_WAIT_S for all of them. If some never come, it raises RankStranded with the
    original reason: Ray Train then stops the worker group, and the launch is restarted
    (train.max_failures) or its unfinished trials are recorded as failed with that reason.
    """
    if world == 1 or not dist.is_initialized():
        return
    store = dist.distributed_c10d._get_default_store()
    name = f"amdahl/trial-end/{key}"
    arrived = store.add(name, 1)
    if error is None:
        return
    deadline = time.monotonic() + FAILED_RANK_WAIT_S
    while arrived < world:
        if time.monotonic() > deadline:
            # The reason's class leads ("oom: ..."), so the driver records this trial as an
            # out-of-memory, not a generic failure, when one rank ran out of memory.
            kind, _, reason = error.splitlines()[0].partition(": ")
            raise RankStranded(
                f"{kind}: rank {dist.get_rank()}: {reason} (while {world - arrived} other "
                "rank(s) were still in the trial's collectives; the worker group was stopped)"
            )
        time.sleep(0.05)
        arrived = store.add(name, 0)


def _gather(stats: dict[str, Any], error: str | None, world: int) -> list[dict[str, Any]]:
    """Every rank's (stats, error), in rank order (a collective: all ranks must call it)."""
    import ray

    mine = {"stats": stats, "error": error, "node": ray.get_runtime_context().get_node_id()}
    if not dist.is_initialized() or world == 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out


def results_row(
    launch: LaunchConfig,
    trial: TrialConfig,
    repeat: int,
    ranks: list[dict],
    started: float,
    stamp: str,
    device: torch.device,
) -> dict[str, Any]:
    """One trial repeat's results row from every rank's (stats, error) (`_gather`): its identity
    and where it ran, then the first rank's failure or the ranks' aggregated measurements."""
    errors = [r["error"] for r in ranks if r["error"]]
    row: dict[str, Any] = {
        **row_identity(launch, trial, repeat, started_at=stamp),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "torch_threads": launch.resources.torch_threads,
        "host": _stdlib_platform.node(),
        "versions": json.dumps(process_versions()),
        "nodes": json.dumps([r.get("node") for r in ranks]),
    }
    if errors:
        first = errors[0]
        row["status"] = failure_status(first)
        row["error"] = first
    else:
        row.update(aggregate_ranks([r["stats"] for r in ranks], trial, launch))
    row["wall_s"] = time.perf_counter() - started
    return row


def aggregate_ranks(
    stats: list[dict[str, Any]], trial: TrialConfig, launch: LaunchConfig
) -> dict[str, Any]:
    """Per-rank measurements -> one row: throughput over all ranks, median and max per phase;
    the per-step curves (`history`) are rank 0's."""
    med = lambda k: statistics.median(r[k] for r in stats)  # noqa: E731
    top = lambda k: max(r[k] for r in stats)  # noqa: E731
    micro = stats[0]["micro_steps"]
    global_batch = trial.per_device_batch * len(stats) * micro
    window = top("window_s")
    measured_steps = stats[0]["measured_steps"]
    throughput = global_batch * measured_steps / window
    flops = trial.flops_per_sample
    losses = [r["final_loss"] for r in stats]
    diverged = not all(math.isfinite(v) for v in losses)
    reserved = [r["peak_mem_reserved_bytes"] for r in stats if r["peak_mem_reserved_bytes"]]
    return {
        "status": "diverged" if diverged else "ok",
        "error": "non-finite training loss" if diverged else None,
        "global_batch": global_batch,
        "micro_steps": micro,
        "steps": measured_steps,
        "lr": stats[0]["lr"],
        "steps_to_target": stats[0]["steps_to_target"],
        "time_to_target_s": top("time_to_target_s") if stats[0]["steps_to_target"] else None,
        "throughput": throughput,
        "measured_s": window,
        "step_time_s": top("step_time_s"),
        "step_time_max_s": top("step_time_max_s"),
        "data_wait_s": med("data_wait_s"),
        "data_wait_max_s": top("data_wait_s"),
        "data_wait_host_s": med("data_wait_host_s"),
        "transfer_s": med("transfer_s") if stats[0]["transfer_s"] is not None else None,
        "forward_s": med("forward_s"),
        "backward_s": med("backward_s"),
        "optimizer_s": med("optimizer_s"),
        "warmup_s": top("warmup_s"),
        "first_step_s": top("first_step_s"),
        "compile_s": top("compile_s"),
        "setup_s": top("setup_s"),
        "final_loss": statistics.fmean(losses),
        "val_loss": stats[0]["val_loss"],
        "val_accuracy": stats[0]["val_accuracy"],
        "peak_mem_bytes": top("peak_mem_bytes"),
        "model_state_bytes": top("model_state_bytes"),
        "peak_mem_reserved_bytes": max(reserved) if reserved else None,
        "flops_per_sample": flops,
        "achieved_flops": throughput * flops if flops else None,
        "comm_s": med("comm_s") if stats[0]["comm_s"] is not None else None,
        "peak_flops": med("peak_flops"),
        "mfu": throughput * flops / (med("peak_flops") * len(stats)) if flops else None,
        "history": json.dumps(stats[0]["history"], separators=(",", ":")),  # rank 0's curves
    }
