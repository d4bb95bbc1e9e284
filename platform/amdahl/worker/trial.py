"""One trial's timed loop, inside a Ray Train worker: build the model, train it for the
launch's steps, measure, and return this rank's statistics (worker/harness.py runs the trials
of a launch and reports their rows).

Each trial is isolated (fresh seed, model, optimizer and compiled graph, its own warmup, memory
peak reset, compile caches). Timing rules (asynchronous execution needs synchronised timers):
- phase marks go into a step clock (stepclock.py): CUDA events on a GPU, read once after one
  synchronize at the end of the trial; `perf_counter` on CPU, where work is synchronous;
- the measured window opens after the warmup steps and closes with a device synchronize; the
  first step is recorded apart (compilation lands there);
- input reaches the device through `feed.DeviceFeed`, a step's micro-batches copied on a side
  stream while the step before computes; data wait is the device's idle gap between steps,
  less the spans the harness itself holds the device (the window's opening synchronize, a
  validation pass) (docs/architecture.md, "What a step's columns mean");
- the measured window runs with the heap that existed before it frozen (`gc.freeze`): a full
  collection otherwise rescans every object of the worker process (Ray's, torch's; ~0.2 s
  for 330k objects without Ray), a pause the loop's own per-step records would trigger and a
  plain training loop would not. Inside a launch the harness froze the launch's heap already,
  and that freeze is left alone: `gc.unfreeze` thaws every frozen object, the launch's too, so
  a trial that froze and thawed its own would make every later trial's memory reset collect
  the whole heap again (0.16 s a trial, measured);
- FLOPs per sample are counted after all of that, on rank 0, never inside a timed phase
  (worker/flops.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from amdahl.columns import history_steps
from amdahl.protocol.contract import LaunchConfig, TrialConfig
from amdahl.protocol.sizing import EXPOSED_COMM_PAIRS, profiles
from amdahl.worker.checkpointing import apply_checkpointing
from amdahl.worker.failure_site import failure_text
from amdahl.worker.feed import DeviceFeed
from amdahl.worker.flops import counted_flops
from amdahl.worker.input import host_batches
from amdahl.worker.peak import measure_peak_flops
from amdahl.worker.profile import profile_steps_pass
from amdahl.worker.stepclock import StepClock, StepMarks, attribute, clock_for, hold
from amdahl.worker.sync import SyncStrategy, make_strategy, model_state_bytes, unwrap
from amdahl.worker.tensor_ledger import MEMORY_COLUMNS, StepMemory, memory_peak, memory_reset
from amdahl.worker.training import (
    LRSchedule,
    Precision,
    compile_caches,
    failure_kind,
    first_line,
    make_optimizer_factory,
    reset_process_state,
    target_reached,
    tf32_flags,
)
from amdahl.worker.user_output import printed_once
from amdahl.worker.utilisation import UtilisationSampler
from amdahl.workload.api import Workload

# --------------------------------------------------------------------------- one trial


@dataclass(frozen=True)
class TrialRun:
    """What one run of a trial needs: the workload (built with the trial's params), the trial
    and the launch (its steps, rung and train section) it runs in, this rank's training input
    (`source`: worker/input.py's) and validation rows, and where it runs; for a halving rung,
    the kept trial it continues (`resume`), the list to keep it in (`keep`), and its
    configuration's own compile caches (`compile_dir`)."""

    workload: Workload
    trial: TrialConfig
    launch: LaunchConfig
    source: Any
    val: dict[str, np.ndarray]
    where: Placement
    resume: KeptTrial | None = None
    keep: list[KeptTrial] | None = None
    compile_dir: Path | None = None


@dataclass(frozen=True)
class Placement:
    """Where a trial runs: this rank's device, its rank and the trial's world size."""

    device: torch.device
    rank: int
    world: int


@dataclass
class _Trial:
    """Everything one trial's loop and its side measurements use, built by `_start_trial`."""

    workload: Workload
    trial: TrialConfig
    launch: LaunchConfig
    where: Placement
    precision: Precision
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    strategy: SyncStrategy
    scaler: torch.amp.GradScaler | None
    feed: DeviceFeed
    clock: StepClock
    wrap_s: float
    #: Samples CPU/GPU busy share over the measured window (worker/utilisation.py).
    utilisation: UtilisationSampler
    #: Counts the tensor bytes of one step outside the window (worker/tensor_ledger.py).
    memory: StepMemory
    #: Whether this trial freezes the heap for its window (and thaws it after): only where
    #: nothing froze it before (a launch's harness does, once for all its trials).
    freezes_heap: bool = False

    @property
    def device(self) -> torch.device:
        return self.where.device

    def forward(self, model: torch.nn.Module, batch: Any) -> tuple[Any, Any, torch.Tensor]:
        """(output, labels, loss) of one batch in the trial's precision (cast, autocast)."""
        x, y = self.workload.split_batch(batch)
        with self.precision.autocast(self.device):
            out, loss = self.workload.forward(model, self.precision.cast_input(x), y)
            return out, y, loss

    def backward(self, loss: torch.Tensor, micro_steps: int) -> None:
        """Backward of one micro-batch's share of the step's loss (loss / micro_steps), through
        the fp16 loss scaler when the trial has one. At one micro-step nothing is divided: a
        scalar op and its autograd node cost ~10 us a step on CPU, beside a plain loop that
        has neither (docs/architecture.md, "What the loop costs beside a plain loop")."""
        if micro_steps > 1:
            loss = loss / micro_steps
        (self.scaler.scale(loss) if self.scaler else loss).backward()


def run_trial_guarded(run: TrialRun) -> tuple[dict[str, Any], str | None, str | None]:
    """Run one trial (or continue a kept one: `run_trial`); any exception becomes a recorded
    failure, never a crashed launch.

    Returns (stats, error, kind): kind is None on success, else 'oom', 'failed', 'poisoned'
    (the process cannot run another trial) or 'peer_lost' (another rank's process is gone); on
    the last two the caller ends the worker group."""
    try:
        stats = run_trial(run)
        return stats, None, None
    except Exception as e:  # noqa: BLE001 - every failure is a result, with its reason
        kind = failure_kind(e)
        if kind == "oom":
            return {}, f"oom: {first_line(e)}", kind
        return {}, failure_text(e, first_line(e)), kind


def run_trial(run: TrialRun) -> dict[str, Any]:
    """Train one configuration and return this rank's measurements.

    Process-wide state is the trial's own for its duration: compiled graphs of earlier trials
    are forgotten, TF32 is on only for tf32 and restored after, and an inductor trial compiles
    into fresh caches unless `options.compile_cache: warm` asks for the shared ones, or into
    `compile_dir`, its configuration's own through a search (worker/compile_dirs.py).

    A halving rung's trial can be kept instead of closed (`keep`: the trial is appended to it,
    its model, optimizer, sync wrapper and input left as they are) and continued by the next
    rung (`resume`): the continuation runs only the steps the rung adds, with no set-up and no
    warmup, and its measurements pool every window the trial has run (worker/resident.py)."""
    workload, trial, launch, where = run.workload, run.trial, run.launch, run.where
    resume, keep, compile_dir = run.resume, run.keep, run.compile_dir
    device = where.device
    tf32, fresh_caches = trial.settings.precision == "tf32", trial.compile_cache == "cold"
    own = compile_dir if resume is None else None
    with tf32_flags(tf32), compile_caches(fresh_caches and resume is None, own):
        if resume is None:
            reset_process_state()
            mem_baseline = memory_reset(device)
            setup_start = time.perf_counter()
            t, record = _start_trial(workload, trial, launch, run.source, where), _LoopRecord()
            setup_s = time.perf_counter() - setup_start
        else:  # the launch of this rung, the rest as the trial's first item left it
            t, record, setup_s = resume.t, resume.record, resume.first["setup_s"]
            t.launch, t.utilisation = launch, UtilisationSampler(device)
        clean = kept = False
        try:
            stats = _train(t, run.val, setup_s, record)
            # The peak is the trial's, before the profiler's buffers (which are not); a
            # continuation's is its first item's (the same model and batches, warmup included).
            if resume is None:
                after = functools.partial(_untimed_step, t, t.launch.steps_per_trial)
                stats.update(memory_peak(device, mem_baseline, t.memory.ledger_after(after)))
            else:
                stats.update(resume.memory)
            stats.update(_profile(t))
            clean = True
            if keep is not None:
                memory = {k: stats[k] for k in MEMORY_COLUMNS}
                keep.append(KeptTrial(t, record, {"setup_s": setup_s}, memory))
                kept = True
        finally:
            t.utilisation.stop()
            if t.freezes_heap:
                gc.unfreeze()  # a loop that raised inside its window left the heap frozen
            if not kept:
                t.strategy.close(clean=clean)
        stats["model_state_bytes"] = sum(model_state_bytes(t.model, t.optimizer))
        stats["windows"] = record.windows
        # After every timed phase and the memory peak, on rank 0 (whose figure the row takes):
        # FLOPs per sample counted on the plain model and the trial's next batch (the one the
        # feed holds ahead; on CPU fetched now, from the step's worth a trial's rows keep for it).
        feed = t.feed
        del t
        if where.rank == 0:
            stats["flops_counted"], stats["flops_count_s"] = counted_flops(
                workload, feed.peek, trial.settings.activation_checkpointing
            )
        del feed
        precision = trial.settings.precision
        stats["peak_flops"] = workload.peak_flops(precision) or measure_peak_flops(
            device, precision
        )
        return stats


@dataclass
class KeptTrial:
    """A trial kept in its rank after a ranking rung, for the next rung to continue: the built
    trial, its step record (every step so far, so the continuation's figures pool its windows),
    and what comes from its first item (set-up seconds, memory peaks)."""

    t: _Trial
    record: _LoopRecord
    first: dict[str, float]
    memory: dict[str, Any]

    def close(self) -> None:
        """Release what the trial holds beyond its memory: its input iterator (a pinning
        thread and its pinned tables) and a parameter server's actors. No collective (not
        `clean`): ranks let a kept trial go at different times, and none steps it any more."""
        self.t.feed.close()
        self.t.strategy.close(clean=False)


def _start_trial(
    workload: Workload, trial: TrialConfig, launch: LaunchConfig, source: Any, where: Placement
) -> _Trial:
    precision = Precision.of(trial.settings.precision)
    model, optimizer, strategy, wrap_s = build_trial_model(workload, trial, launch, where.device)
    prefetch, pin = trial.settings.prefetch_batches, where.device.type == "cuda"
    batches = host_batches(source, trial.per_device_batch, prefetch, pin)
    return _Trial(
        workload=workload,
        trial=trial,
        launch=launch,
        where=where,
        precision=precision,
        model=model,
        optimizer=optimizer,
        strategy=strategy,
        scaler=precision.scaler(where.device),
        feed=DeviceFeed(batches, where.device),
        clock=clock_for(where.device.type),
        wrap_s=wrap_s,
        utilisation=UtilisationSampler(where.device),
        memory=StepMemory(model, optimizer, launch.train.warmup_steps, not trial.inductor),
        freezes_heap=gc.get_freeze_count() == 0,
    )


def build_trial_model(
    workload: Workload, trial: TrialConfig, launch: LaunchConfig, device: torch.device
) -> tuple[torch.nn.Module, Any, SyncStrategy, float]:
    """Fresh model (seeded), in the trial's precision, its blocks checkpointed as the trial
    asks (worker/checkpointing.py), wrapped by its sync strategy and compiler.

    Returns (model, optimizer, strategy, seconds spent in `torch.jit.script` / `torch.compile`).
    TorchScript scripts the plain module (DDP cannot be scripted); inductor compiles the
    strategy's wrapper so DDP's bucketing is visible to the compiler. Only those two calls are
    timed: the strategy's wrapping and the optimizer are not compilation (a process's first
    optimizer imports torch._dynamo, seconds that are not the trial's compile cost).
    """
    settings = trial.settings
    torch.manual_seed(launch.train.seed)
    with printed_once():  # the workload's own prints, once per process
        model = workload.build_model().to(device)
    weights = Precision.of(settings.precision).weights_dtype
    if weights is not None:
        model = model.to(weights)
    apply_checkpointing(workload, model, settings.activation_checkpointing)
    wrap_s = 0.0
    if settings.compile == "torchscript":
        start = time.perf_counter()
        model = torch.jit.script(model)
        wrap_s = time.perf_counter() - start
    strategy = make_strategy(settings.sync, settings.options, device, settings.accumulate_steps)
    model, optimizer = strategy.prepare(model, make_optimizer_factory(launch.train))
    if trial.inductor:
        start = time.perf_counter()
        model = torch.compile(model, mode=settings.options["compile_mode"])
        wrap_s = time.perf_counter() - start
    return model, optimizer, strategy, wrap_s


# --------------------------------------------------------------------------- the timed loop


def _train(
    t: _Trial, val: dict[str, np.ndarray], setup_s: float, record: _LoopRecord
) -> dict[str, Any]:
    """The timed loop, then the trial's statistics (`_trial_stats`). A record that has steps
    already (a kept trial, continued) goes on from its last step: its window opens at once."""
    launch, strategy, clock, feed = t.launch, t.strategy, t.clock, t.feed
    model, optimizer = t.model, t.optimizer
    micro_steps = strategy.micro_steps
    lr = LRSchedule.for_trial(launch.train, t.trial.per_device_batch * t.where.world * micro_steps)
    warm, target = launch.train.warmup_steps, launch.target
    first = len(record.steps)
    opens = first if first else warm  # the step before which this item's window opens
    if first:
        # What ran between the two items is not this trial's input wait: cut it out of the
        # first step's gap, as a held span from the last step's end (stepclock.attribute).
        record.held = [(record.steps[-1].marks[-1], clock.mark())]
        record.paused_s.append((first, time.perf_counter() - record.stopped))

    train_start = window_start = time.perf_counter()
    eval_before = record.eval_s
    for step in range(first, launch.steps_per_trial):
        if step == opens:
            with hold(clock, record.held):  # cut out of this step's data wait (stepclock.py)
                if t.freezes_heap:
                    gc.freeze()  # collections in the window skip what existed before it
                window_start = time.perf_counter()
                record.window_unix = time.time()  # when the sweep's user saw a figure start
                t.utilisation.start()
        taken = feed.take(micro_steps)
        with t.memory.during(step):  # the last warmup step's tensor bytes (worker/tensor_ledger.py)
            marks = [clock.mark()]
            for i, batch in enumerate(taken.batches):
                with strategy.micro_context(model, i):
                    loss = t.forward(model, batch)[2]
                    marks.append(clock.mark())
                    t.backward(loss, micro_steps)
                    marks.append(clock.mark())
            lr.update(optimizer, step)
            strategy.step(optimizer, t.scaler)
            optimizer.zero_grad(set_to_none=True)
            strategy.after_step(model, step)
            marks.append(clock.mark())
        feed.prefetch(micro_steps)  # the next step's batches, copied while this one computes
        record.steps.append(StepMarks(taken.host_wait, marks, taken.copies, record.held))
        record.losses.append(loss.detach())  # the step's last micro-batch's
        record.held = []
        if target and step >= warm and (step + 1 - warm) % target.eval_every == 0:
            with hold(clock, record.held):
                eval_start = time.perf_counter()
                if target_reached(_evaluate(t, val), target):
                    record.reached = (step + 1, eval_start - train_start - record.eval_s)
                record.eval_s += time.perf_counter() - eval_start
            if record.reached:
                break
    clock.synchronize()
    record.stopped = time.perf_counter()
    record.item_window_s = record.stopped - window_start - (record.eval_s - eval_before)
    record.window_s += record.item_window_s
    record.windows += 1
    t.utilisation.stop()
    if t.freezes_heap:
        gc.unfreeze()
    record.lr_peak = lr.peak
    return _trial_stats(t, record, val, setup_s)


@dataclass
class _LoopRecord:
    """What the timed loop leaves for the statistics: per-step marks and losses (on the
    device, read once after the loop), the window, and time-to-target bookkeeping."""

    steps: list[StepMarks] = field(default_factory=list)
    losses: list[torch.Tensor] = field(default_factory=list)
    eval_s: float = 0.0
    reached: tuple[int, float] | None = None
    #: (pause, resume) marks of the harness's own holds before the next step (`hold`)
    held: list[tuple[Any, Any]] = field(default_factory=list)
    window_s: float = 0.0  # measured seconds, every window's
    item_window_s: float = 0.0  # measured seconds of the last item's window
    window_unix: float | None = None  # Unix time the last item's window opened
    lr_peak: float = 0.0
    windows: int = 0  # measured windows: more than one where a kept trial was continued
    stopped: float = 0.0  # perf_counter when the last window closed
    #: (first step of a continuation, seconds since the window before it closed)
    paused_s: list[tuple[int, float]] = field(default_factory=list)


def _trial_stats(
    t: _Trial, record: _LoopRecord, val: dict[str, np.ndarray], setup_s: float
) -> dict[str, Any]:
    """This rank's measurements of one trial, from the loop's record (after the loop, so the
    loop itself does no bookkeeping beyond its marks)."""
    warm = t.launch.train.warmup_steps
    full = not t.launch.ranking_only
    probe_start = time.perf_counter()
    comm_s = _exposed_communication(t) if full else None
    comm_probe_s = time.perf_counter() - probe_start if full else None
    phases = attribute(record.steps, t.clock)
    measured = phases[warm:]
    steady = statistics.median(p["total"] for p in measured)
    first_step = phases[0]["total"] + phases[0]["data_wait"]
    eval_start = time.perf_counter()
    val_loss, val_acc = _evaluate(t, val) if full else (None, None)
    validation_s = time.perf_counter() - eval_start if full else None
    mean = lambda key: statistics.fmean(p[key] for p in measured)  # noqa: E731
    losses = record.losses
    return {
        "window_s": record.window_s,
        "item_window_s": record.item_window_s,
        "window_opened_unix": record.window_unix,
        "step_time_s": steady,
        "step_time_max_s": max(p["total"] for p in measured),
        "data_wait_s": mean("data_wait"),
        "data_wait_host_s": mean("host_wait"),
        "transfer_s": mean("transfer") if t.clock.on_device else None,
        "forward_s": mean("forward"),
        "backward_s": mean("backward"),
        "optimizer_s": mean("optimizer"),
        "warmup_s": sum(p["total"] + p["data_wait"] for p in phases[:warm]),
        "first_step_s": first_step,
        # the first step's compute alone: its input wait is the pipeline's, not the compiler's
        "compile_s": t.wrap_s + max(0.0, phases[0]["total"] - steady)
        if t.trial.settings.compile != "eager"
        else 0.0,
        "setup_s": setup_s,
        "final_loss": float(torch.stack(losses[-min(5, len(losses)) :]).float().mean()),
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "micro_steps": t.strategy.micro_steps,
        "measured_steps": len(measured),
        "lr": record.lr_peak,
        "steps_to_target": record.reached[0] if record.reached else None,
        "time_to_target_s": record.reached[1] if record.reached else None,
        "comm_s": comm_s,
        "comm_probe_s": comm_probe_s,
        "validation_s": validation_s,
        "history": _history(phases, losses, record, t.clock),
        "utilisation": t.utilisation.series(),
    }


def _history(
    phases: list[dict[str, float]],
    losses: list[torch.Tensor],
    record: _LoopRecord,
    clock: StepClock,
) -> dict[str, list]:
    """Per-step curves (the `history` column), sampled here so that little leaves the worker;
    the losses are read off the device once, now, not in the loop. `elapsed_s`: the first
    step's input wait plus the step clock's span from its start to this step's end (what the
    MLflow mirror times each point by), less the pauses between a kept trial's items."""
    steps = record.steps
    kept = history_steps(len(phases))
    kept_loss = torch.stack([losses[i] for i in kept]).float().tolist() if kept else []
    short = lambda v: float(f"{v:.6g}") if math.isfinite(v) else None  # noqa: E731
    lead = phases[0]["data_wait"] if kept else 0.0
    paused = lambda i: sum(s for first, s in record.paused_s if first <= i)  # noqa: E731
    return {
        "step": [i + 1 for i in kept],
        "loss": [short(v) for v in kept_loss],
        "step_time_s": [short(phases[i]["total"]) for i in kept],
        "data_wait_s": [short(phases[i]["data_wait"]) for i in kept],
        "elapsed_s": [
            round(lead + clock.span(steps[0].marks[0], steps[i].marks[-1]) - paused(i), 6)
            for i in kept
        ],
    }


# ------------------------------------------------ measured outside the window: comm, validation


def _exposed_communication(t: _Trial) -> float | None:
    """Exposed gradient communication per step, estimated outside the measured window.

    Method: EXPOSED_COMM_PAIRS interleaved pairs of forward+backward passes, one with DDP's
    gradient all-reduce and one under `no_sync()` (no all-reduce, no optimizer step, gradients
    discarded), on the same batches; exposed communication = median(synced) - median(no_sync),
    clipped at 0. It counts only the all-reduce time that backward could not hide, which is
    what costs throughput. Limits: only for strategies built on DDP (others report None and
    their communication shows up in optimizer time); not for compiled models (no_sync would
    recompile); noisy when the difference is below timer resolution. Not at one device: there
    is no collective to hide (DDP's one-rank all-reduce is wrapper cost, in the model's omega),
    and the passes cost an item ~0.02 s on a 2-core box (benchmarks/sweep_timeline.py).
    """
    ddp = t.model if isinstance(t.model, torch.nn.parallel.DistributedDataParallel) else None
    if ddp is None or t.trial.inductor or t.where.world == 1:
        return None
    timings: dict[bool, list[tuple[Any, Any]]] = {True: [], False: []}
    for _ in range(EXPOSED_COMM_PAIRS):
        batch = next(t.feed)
        for synced in (True, False):
            with contextlib.nullcontext() if synced else ddp.no_sync():
                start = t.clock.mark()
                t.backward(t.forward(ddp, batch)[2], 1)
                end = t.clock.mark()
            ddp.zero_grad(set_to_none=True)
            timings[synced].append((start, end))
    t.clock.synchronize()
    spans = {k: statistics.median(t.clock.span(a, b) for a, b in v) for k, v in timings.items()}
    return max(0.0, spans[True] - spans[False])


def _profile(t: _Trial) -> dict[str, Any]:
    """The profiler pass, after the measured window and validation (worker/profile.py):
    `profile_s`, and this rank's compressed Chrome trace (`trace`, which the harness ships to
    the driver apart from the row) or why there is none (`trace_error`)."""
    launch = t.launch
    if not profiles(
        launch.train.profile_steps, t.where.world, t.trial.settings.sync, launch.ranking_only
    ):
        return {"profile_s": None}
    traced = profile_steps_pass(
        lambda step: _untimed_step(t, step),
        launch.train.profile_steps,
        t.device,
        first_step=launch.steps_per_trial,
    )
    return {"profile_s": traced.seconds, "trace": traced.blob, "trace_error": traced.error}


def _untimed_step(t: _Trial, step: int) -> None:
    """One optimizer step as the timed loop runs it (micro-steps, the strategy's step and
    hooks), without its marks; the learning rate stays where the loop left it."""
    micro_steps = t.strategy.micro_steps
    batches = [next(t.feed) for _ in range(micro_steps)]
    for i, batch in enumerate(batches):
        with t.strategy.micro_context(t.model, i):
            t.backward(t.forward(t.model, batch)[2], micro_steps)
    t.strategy.step(t.optimizer, t.scaler)
    t.optimizer.zero_grad(set_to_none=True)
    t.strategy.after_step(t.model, step)


@torch.no_grad()
def _evaluate(t: _Trial, val: dict[str, np.ndarray]) -> tuple[float, float | None]:
    """Validation loss/accuracy over the held-out split; each rank takes every world-th row.

    Every rank takes part (sharded models need all ranks for a forward), and the sums are
    all-reduced, so the figure covers the whole split.
    """
    model, rank, world = unwrap(t.model), t.where.rank, t.where.world
    batch_size = t.trial.per_device_batch
    was_training = model.training
    model.eval()
    n = len(next(iter(val.values())))
    idx = np.arange(rank, n, world)
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct_sum = torch.zeros((), dtype=torch.float64)
    has_accuracy = True
    # Sharded models all-gather in every forward, so every rank runs the same number of them.
    per_rank = math.ceil(n / world)
    for b in range(math.ceil(per_rank / batch_size)):
        sel = idx[b * batch_size : (b + 1) * batch_size]
        counted = len(sel) > 0
        if not counted:
            sel = np.arange(min(1, n))  # a real row to join the collective, not counted
        batch = {k: torch.from_numpy(v[sel]).to(t.device) for k, v in val.items()}
        out, y, loss = t.forward(model, batch)
        if not counted:
            continue
        loss_sum += float(loss) * len(sel)
        correct = t.workload.correct(out, y)
        has_accuracy = correct is not None
        if has_accuracy:
            correct_sum += float(correct)
    totals = torch.stack(
        [loss_sum, correct_sum, torch.tensor(float(len(idx)), dtype=torch.float64)]
    )
    if dist.is_initialized() and world > 1:
        totals = totals.to(t.device)  # NCCL reduces device tensors only
        dist.all_reduce(totals)  # sums, once per trial
        totals = totals.cpu()
    model.train(was_training)
    count = max(float(totals[2]), 1.0)
    return float(totals[0]) / count, (float(totals[1]) / count if has_accuracy else None)
