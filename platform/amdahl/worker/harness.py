"""Worker side: a launch's entry point, run inside each Ray Train worker of its worker group.

One launch = one worker group that lives as long as the driver has work of its shape: rank 0
leases the next trial run from the driver's work queue (driver/work_queue.py), broadcasts it to
the group, every rank runs it (worker/trial.py; ranks beyond the trial's device count wait), and
rank 0 gathers the per-rank measurements into one results row (worker/rows.py) and acknowledges
the run with it. Before the first run each rank reads the validation split, measures its peak
FLOP/s and starts a launch-long input stream. No Train checkpoint: the queue knows what is done,
so a restarted worker group goes on with the run it lost. Workers never talk to MLflow.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from amdahl.protocol.contract import LaunchConfig, TrialConfig
from amdahl.protocol.items import CLOSED, WAIT, WorkItem, message_sizes
from amdahl.worker.calibration_measurement import calibration_result
from amdahl.worker.compile_dirs import ConfigurationCaches, fxgraph_cache_hits
from amdahl.worker.input import train_source, validation_rows
from amdahl.worker.peak import measure_peak_flops
from amdahl.worker.queue_client import QueueClient
from amdahl.worker.resident import ResidentTrials, unkeepable
from amdahl.worker.rows import results_row
from amdahl.worker.training import ProcessPoisoned
from amdahl.worker.trial import KeptTrial, Placement, TrialRun, run_trial_guarded
from amdahl.worker.worlds import TrialWorlds
from amdahl.workload.api import Workload
from amdahl.workload.code import make_workload

#: Longest rank 0 waits for an item before the group meets again (a heartbeat: the ranks wait in
#: Ray Train's broadcast, which warns after 60 s of silence).
_LEASE_WAIT_S = 1.0


# --------------------------------------------------------------------------- entry point


def train_launch(loop_config: dict[str, LaunchConfig]) -> None:
    """`train_loop_per_worker` of the launch's TorchTrainer (`train_loop_config` is
    `{"launch": LaunchConfig}`): run every item the driver's queue hands this launch."""
    import ray
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
    start = 0  # this group's start number (rank 0's): its leases name it
    if rank == 0:  # hands back what a worker group that died here had leased
        start = QueueClient.of(launch).enter(launch.launch_id)
    device = ray.train.torch.get_device()
    worlds = TrialWorlds(rank, ctx.get_world_size(), launch.collective_timeout_s, device)
    torch.set_num_threads(launch.resources.torch_threads)
    # The launch's input (stored rows, preprocessing, validation split) is the same for every
    # trial (plan: Workload.input_key); model and loss come from each trial's own params.
    workload = make_workload(launch.workload, launch.trials[0].settings.params)
    shards, val = _before_first_trial(launch, workload, rank, device)
    # Everything alive now lives for the whole launch: keep it out of the collections that
    # each trial's memory reset runs (a full collection of torch's and Ray's ~380k objects
    # took 0.15-0.2 s per trial; a trial's own garbage is still collected).
    gc.freeze()
    trials = {t.trial_id: t for t in launch.trials}
    residents = ResidentTrials(device, launch.resources.workers)  # halving's kept trials
    compile_dirs = ConfigurationCaches()  # and its compiled configurations' own caches
    state = _LaunchState(workload, val, residents, compile_dirs)
    # Where a launch's start went, in its first row: when this function began (against the
    # driver's clock, the Ray Train start) and its own set-up before the first trial.
    launch_start = {
        "launch_entered_unix_s": entered_unix,
        "launch_setup_s": time.perf_counter() - entered,
    }
    answered = time.perf_counter()  # the end of the previous answer: hand-over starts
    try:
        while (item := _next_item(launch, rank, start, worlds.launch_size)) != CLOSED:
            if item == WAIT:
                continue
            if item.kind == "calibrate":
                _calibrate(launch, item, worlds, rank, device)
                answered = time.perf_counter()
                continue
            trial, item_launch = trials[item.trial_id], launch.for_item(item)
            devices = trial.settings.devices
            if not worlds.enter(devices):
                continue  # an idle rank: the next item's broadcast is its barrier
            if devices not in shards:
                shards[devices] = train_source(
                    launch, workload, rank, devices, device.type == "cuda"
                )
            handover = {"handover_s": time.perf_counter() - answered}
            where = Placement(device, rank, devices)
            row = _run_item(item_launch, item, trial, shards[devices], where, state)
            if rank == 0:
                QueueClient.of(launch).ack(item.key, {**row, **launch_start, **handover})
            launch_start = {}
            answered = time.perf_counter()
            _freeze_survivors(residents)
    finally:
        compile_dirs.close()  # files only: also when the group fails
    residents.close()
    worlds.leave()


def _freeze_survivors(residents: ResidentTrials) -> None:
    """What outlives a trial lives for the launch too (inductor's modules and caches, ~80k
    objects once imported): collect the trial's garbage, then freeze the survivors, so no later
    trial's reset or window scans them. Outside every measured window (in the next item's
    hand-over). A kept trial let go was frozen with them: thawed first."""
    residents.thaw_if_released()
    gc.collect()
    gc.freeze()


def _calibrate(
    launch: LaunchConfig, item: WorkItem, worlds: TrialWorlds, rank: int, device: torch.device
) -> None:
    """A calibration item: every rank of the group measures the all-reduce (one worker the
    peaks); rank 0 answers with the measurement, or gives the item up with the reason."""

    worlds.enter(launch.resources.workers)
    worlds.align_group_names()  # the calibration makes groups of its first 2, 3, 4 ranks
    try:
        result = calibration_result(message_sizes(item.max_bytes), device, rank)
    except Exception as e:  # noqa: BLE001 - the sweep goes on without a calibration
        if rank == 0:
            QueueClient.of(launch).fail(item.key, f"calibration failed: {e}")
        return
    if rank == 0:
        result["resources_per_worker"] = {"CPU": launch.resources.cpus_per_worker}
        QueueClient.of(launch).ack(item.key, result)


def _next_item(launch: LaunchConfig, rank: int, start: int, world: int) -> WorkItem | str:
    """The group's next item, the same on every rank: rank 0 leases it from the driver's
    queue (waiting at most _LEASE_WAIT_S) and broadcasts it; WAIT when there was none yet.
    A group that Ray Train is stopping leases nothing: the item would fail with its end."""
    from ray.train.collective import broadcast_from_rank_zero

    item: WorkItem | str | None = None
    if rank == 0:  # the queue answers the moment an item is put (a long poll)
        _check_world_intact(world, None, None)
        item = QueueClient.of(launch).lease(launch.launch_id, _LEASE_WAIT_S, start)
    return broadcast_from_rank_zero(item)


@dataclass
class _LaunchState:
    """What a launch's items share on this rank: the launch's workload (its input's), the
    validation rows, halving's kept trials and its compiled configurations' caches."""

    workload: Workload
    val: dict[str, np.ndarray]
    residents: ResidentTrials
    compile_dirs: ConfigurationCaches


def _run_item(
    launch: LaunchConfig,
    item: WorkItem,
    trial: TrialConfig,
    source: Any,
    where: Placement,
    state: _LaunchState,
) -> dict[str, Any]:
    """Run one item on this rank (one of the trial's `devices` ranks) and return its
    results row (complete on rank 0): a fresh trial, or the continuation of one kept from the
    rung before (worker/resident.py), kept in turn where the item asks. A failure that must end
    the worker group (a poisoned process, a rank stranded in a collective) is given up in the
    queue with its reason first, so the restarted group does not run it again."""

    started = time.perf_counter()
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    devices, params = trial.settings.devices, trial.settings.params
    workload, residents, compile_dirs = state.workload, state.residents, state.compile_dirs
    own = workload if params == workload.params else make_workload(launch.workload, params)
    resume, restart_reason = residents.take(item, devices, where.device)
    if residents.thaw_if_released():  # what was let go is freed now, before this trial
        gc.collect()
        gc.freeze()
    kept: list[KeptTrial] = []
    refused = unkeepable(source) if item.keep else None
    if refused:
        residents.refuse(item, refused)
    keep = kept if item.keep and not refused else None
    compile_dir, compiled_before = compile_dirs.directory(item, trial)
    hits = fxgraph_cache_hits()
    stats, error, kind = run_trial_guarded(
        TrialRun(own, trial, launch, source, state.val, where, resume, keep, compile_dir)
    )
    reloaded = compiled_before and fxgraph_cache_hits() > hits
    _ship_trace(launch, item, where.rank, stats)
    _check_world_intact(devices, kind, error)
    try:
        if kind == "poisoned":
            # No collective can run in this process any more: end the worker group; the
            # driver starts a new one for the rest.
            raise ProcessPoisoned(error.splitlines()[0])
        _wait_for_every_rank(item.key, error, devices)
    except (ProcessPoisoned, RankStranded) as e:
        reason = f"launch failed: {type(e).__name__}: {e}"
        QueueClient.of(launch).fail(item.key, reason)
        raise
    if error is None:
        stats["continued_from"] = item.continues if resume is not None else None
        stats["restart_reason"] = restart_reason or item.fresh_because
        if reloaded:  # the row's compile figures are a reload's: said in two columns
            stats["compile_cache"] = "own"
            stats["restart_reason"] = (
                f"{stats['restart_reason']}; it loaded its own compiled graphs of an earlier "
                f"rung ({stats.get('compile_s') or 0.0:.2f} s of compile here)"
            )
    gathered = _gather(stats, error, devices)
    if kept:  # kept only where every rank's part ran (and alike on every rank: gathered)
        if all(r["error"] is None for r in gathered):
            state = max(r["stats"]["model_state_bytes"] for r in gathered)
            residents.keep(item, kept[0], state)
        else:
            kept[0].close()
    return results_row(launch, trial, item.repeat, gathered, started, stamp, where.device)


def _ship_trace(launch: LaunchConfig, item: WorkItem, rank: int, stats: dict[str, Any]) -> None:
    """This rank's profiler trace (worker/profile.py) goes to the driver's queue under the
    item's key, apart from the row: not through rank 0 and the row's gather. Every rank does
    it before that gather, so rank 0's acknowledgement comes after every trace."""

    blob, reason = stats.pop("trace", None), stats.pop("trace_error", None)
    if reason:
        logging.getLogger(__name__).warning("rank %d, %s: no trace: %s", rank, item.key, reason)
    if blob is not None:
        QueueClient.of(launch).attach(item.key, rank, blob)


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
    for precision in sorted({t.settings.precision for t in launch.trials}):
        if workload.peak_flops(precision) is None:  # else the workload states its device's
            measure_peak_flops(device, precision)

    # A launch whose workload preprocesses streams its input through Ray Train's split: start
    # that pipeline now, after the peak probe (which it would slow), not in the first trial.
    if launch.input == "ray_data" and launch.preprocesses:
        world = launch.resources.workers
        shards[world] = train_source(launch, workload, rank, world, device.type == "cuda")
        shards[world].warm()
    return shards, val


# --------------------------------------------------------------------------- every rank's end


#: How long a rank whose trial failed waits for the other ranks to finish theirs.
FAILED_RANK_WAIT_S = 30.0


class RankStranded(RuntimeError):
    """A trial failed on some ranks while others were left inside a collective operation."""


class WorldLost(RuntimeError):
    """The trial's world came apart under it: a rank's process died, or Ray Train, stopping the
    worker group, destroyed the process group while this rank's trial was still running."""


def _check_world_intact(world: int, kind: str | None, error: str | None) -> None:
    """Raise WorldLost where this rank's view of a multi-rank trial is not the trial's result.

    It raises without giving the item up: the item stays leased, so Ray Train's restart
    (train.max_failures) runs it again, or the driver records it with the launch's own reason,
    which names the rank that died. Answering instead raced Ray Train's stop (which destroys
    the process group on every rank before ending them): a rank 0 that saw the group gone
    recorded its own transport error as the trial's, and leased the next trial into a group
    about to end, which then failed with the group's death."""
    if world == 1:
        return
    if kind == "peer_lost":
        raise WorldLost(f"another rank's process is gone: {(error or '').splitlines()[0]}")
    if not dist.is_initialized():
        raise WorldLost(
            "the process group was destroyed during the trial: Ray Train is stopping the "
            "worker group"
        )


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
    if world == 1:
        return
    _check_world_intact(world, None, None)
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
    if world == 1:
        return [mine]
    _check_world_intact(world, None, None)  # never a row of this rank's part alone
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out
