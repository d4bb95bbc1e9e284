"""Worker side: the timed training loop, run inside a Ray Train worker for each trial of a launch.

One launch = one worker group running its trials one after another; each trial is isolated (fresh
seed, model, optimizer and compiled graph, its own warmup, memory peak reset). Rank 0 gathers the
per-rank measurements and reports one results row per trial repeat through `ray.train.report`.

Timing rules (seeds' lesson: asynchronous execution needs synchronised timers):
- on CUDA, phase boundaries are CUDA events read after one synchronize at the end of the trial,
  and the measured window closes with `torch.cuda.synchronize()`; on CPU, work is synchronous and
  `perf_counter` is exact;
- warmup steps run first and are excluded; the first step is recorded apart (compilation).
Workers never talk to MLflow.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform as _stdlib_platform
import statistics
import time
import traceback
from collections import deque
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from amdahl.data import train_source, validation_rows, worker_batches
from amdahl.results import ROW_KEY, SETTING_COLUMNS
from amdahl.sync import make_strategy, model_state_bytes, unwrap
from amdahl.workload import Workload, make_workload
from amdahl.worlds import TrialWorlds

_DONE_FILE = "done.json"
_DRAIN_S = 1.0
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------- entry point


def train_launch(config: dict[str, Any]) -> None:
    """`train_loop_per_worker` of the launch's TorchTrainer: run every trial, report each row."""
    import ray.train
    import ray.train.torch

    # DDP's constructor imports torch._dynamo (~1 s of CPU here): pay it now, on every rank at
    # once, rather than inside the first timed trial of each rank (a rank first used by a
    # later, larger trial would pay it there).
    import torch._dynamo  # noqa: F401

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    worlds = TrialWorlds(rank, ctx.get_world_size())
    device = ray.train.torch.get_device()
    threads = config["torch_threads"]
    torch.set_num_threads(threads)
    workload = make_workload(config["workload"], config["trials"][0]["settings"]["params"])
    shards: dict[int, Any] = {}  # this rank's training input, per trial world size
    val = validation_rows(workload, config)

    # A restarted worker group (train.max_failures) resumes after the last reported trial.
    done = {tuple(pair) for pair in config["skip"]} | _reported_before()
    # Everything alive now lives for the whole launch: keep it out of the collections that
    # each trial's memory reset runs (a full collection of torch's and Ray's ~380k objects
    # took 0.15-0.2 s per trial; a trial's own garbage is still collected).
    gc.freeze()
    reported_at = deque([-math.inf, -math.inf], maxlen=2)  # this rank's last two reports
    for trial in config["trials"]:
        for repeat in range(config["repeats"]):
            if (trial["trial_id"], repeat) in done:
                continue
            world = trial["settings"]["devices"]
            done.add((trial["trial_id"], repeat))
            if not worlds.enter(world):
                _report(None, done)  # an idle rank: wait in the report barrier
                reported_at.append(time.monotonic())
                continue
            if world not in shards:
                shards[world] = train_source(config, workload, rank, world)
            started = time.perf_counter()
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            stats, error = _run_guarded(
                workload, trial["settings"], config, shards[world], val, device, rank, world
            )
            _wait_for_every_rank(f"{trial['trial_id']}/{repeat}", error, world)
            gathered = _gather(stats, error, world)
            row = _results_row(config, trial, repeat, gathered, started, stamp, device, threads)
            _report(row if rank == 0 else None, done)
            reported_at.append(time.monotonic())
    # Ray 2.60: if the launch's last rows are still queued for Tune when this function returns,
    # Tune's function trainable can deadlock flushing two of them into its size-1 result queue
    # (seen with trials tens of ms apart). Return only once the row before the last has had
    # _DRAIN_S to reach Tune (rows are collected every 0.25 s): free after a trial that long.
    time.sleep(max(0.0, _DRAIN_S - (time.monotonic() - reported_at[-2])))


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
            {ROW_KEY: json.dumps(row)}, checkpoint=ray.train.Checkpoint.from_directory(tmp)
        )


def _reported_before() -> set[tuple[str, int]]:
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return set()
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, _DONE_FILE)) as f:
            return {(t, r) for t, r in json.load(f)}


def _run_guarded(
    workload: Workload,
    settings: dict,
    config: dict,
    shard: Any,
    val: dict[str, np.ndarray],
    device: torch.device,
    rank: int,
    world: int,
) -> tuple[dict[str, Any], str | None]:
    """Run one trial; any exception becomes a recorded failure, never a crashed launch."""
    try:
        return run_trial(workload, settings, config, shard, val, device, rank, world), None
    except torch.OutOfMemoryError as e:
        return {}, f"oom: {_first_line(e)}"
    except Exception as e:  # noqa: BLE001 - every failure is a result, with its reason
        if isinstance(e, RuntimeError) and _is_host_oom(e):
            return {}, f"oom: {_first_line(e)}"
        tb = traceback.format_exc(limit=-3)
        return {}, f"failed: {type(e).__name__}: {_first_line(e)}\n{tb}"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


# --------------------------------------------------------------------------- one trial


def run_trial(
    workload: Workload,
    settings: dict[str, Any],
    config: dict[str, Any],
    shard: Any,
    val: dict[str, np.ndarray],
    device: torch.device,
    rank: int,
    world: int,
) -> dict[str, Any]:
    """Train one configuration and return this rank's measurements."""
    precision, cuda = settings["precision"], device.type == "cuda"
    per_device_batch = settings["per_device_batch"]
    device_sync = torch.cuda.synchronize if cuda else _nothing
    mem_baseline = _memory_reset(device)
    setup_start = time.perf_counter()

    model, optimizer, strategy, wrap_s = build_trial_model(workload, settings, config, device)
    weights_dtype = torch.bfloat16 if precision == "bf16_weights" else None
    autocast_dtype = _AUTOCAST.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    batches = worker_batches(shard, per_device_batch, settings["prefetch_batches"], device)
    clock = _Clock(cuda)
    lr = LRSchedule.for_trial(config, per_device_batch * world * strategy.micro_steps)
    warm, target = config["warmup_steps"], config["target"]
    total = target["max_steps"] if target else warm + config["steps"]

    def validate() -> tuple[float, float | None]:
        return _evaluate(
            workload,
            unwrap(model),
            val,
            device,
            rank,
            world,
            autocast_dtype,
            weights_dtype,
            per_device_batch,
        )

    steps: list[tuple[float, list[Any]]] = []  # per step: data wait, phase marks
    losses: list[torch.Tensor] = []
    eval_s, reached = 0.0, None  # time-to-target: validation seconds, (steps, seconds)
    setup_s = time.perf_counter() - setup_start
    train_start = window_start = time.perf_counter()

    for step in range(total):
        if step == warm:
            device_sync()
            window_start = time.perf_counter()
        t_data = time.perf_counter()
        micro = [next(batches) for _ in range(strategy.micro_steps)]
        data_wait = time.perf_counter() - t_data
        marks = [clock.mark()]
        for i, batch in enumerate(micro):
            x, y = workload.split_batch(batch)
            if weights_dtype is not None and x.is_floating_point():
                x = x.to(weights_dtype)
            with strategy.micro_context(model, i):
                with torch.autocast(
                    device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
                ):
                    loss = workload.loss(model(x), y) / strategy.micro_steps
                marks.append(clock.mark())
                (scaler.scale(loss) if scaler else loss).backward()
                marks.append(clock.mark())
        lr.update(optimizer, step)
        strategy.step(optimizer, scaler)
        optimizer.zero_grad(set_to_none=True)
        strategy.after_step(model, step)
        marks.append(clock.mark())
        steps.append((data_wait, marks))
        losses.append(loss.detach() * strategy.micro_steps)
        if target and step >= warm and (step + 1 - warm) % target["eval_every"] == 0:
            device_sync()
            eval_start = time.perf_counter()
            quality = validate()
            if _target_reached(quality, target):
                reached = (step + 1, eval_start - train_start - eval_s)
            eval_s += time.perf_counter() - eval_start
            if reached:
                break
    device_sync()
    window = time.perf_counter() - window_start - eval_s
    comm_s = _exposed_communication(
        workload, model, batches, weights_dtype, autocast_dtype, scaler, clock, settings
    )

    phases = clock.resolve([marks for _, marks in steps])
    waits = [wait for wait, _ in steps]
    first_step = phases[0]["total"] + waits[0]
    measured = phases[warm:]
    steady = statistics.median(p["total"] for p in measured)
    final_loss = float(torch.stack(losses[-min(5, len(losses)) :]).float().mean())
    val_loss, val_acc = validate()
    strategy.close()
    memory = _memory_peak(device, mem_baseline)
    return {
        "window_s": window,
        "step_time_s": steady,
        "step_time_max_s": max(p["total"] for p in measured),
        "data_wait_s": statistics.fmean(waits[warm:]),
        "forward_s": statistics.fmean(p["forward"] for p in measured),
        "backward_s": statistics.fmean(p["backward"] for p in measured),
        "optimizer_s": statistics.fmean(p["optimizer"] for p in measured),
        "warmup_s": sum(p["total"] for p in phases[:warm]) + sum(waits[:warm]),
        "first_step_s": first_step,
        "compile_s": wrap_s + max(0.0, first_step - steady)
        if settings["compile"] != "eager"
        else 0.0,
        "setup_s": setup_s,
        "final_loss": final_loss,
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "micro_steps": strategy.micro_steps,
        "measured_steps": len(measured),
        "lr": lr.peak,
        "steps_to_target": reached[0] if reached else None,
        "time_to_target_s": reached[1] if reached else None,
        "comm_s": comm_s,
        "model_state_bytes": sum(model_state_bytes(model, optimizer)),
        **memory,  # read before _peak_flops allocates its matrices
        "peak_flops": _peak_flops(device, autocast_dtype or weights_dtype or torch.float32),
    }


def build_trial_model(
    workload: Workload, settings: dict[str, Any], config: dict[str, Any], device: torch.device
) -> tuple[torch.nn.Module, Any, Any, float]:
    """Fresh model (seeded), in the trial's precision, wrapped by its sync strategy and compiler.

    Returns (model, optimizer, strategy, seconds spent scripting/compiling-wrapping).
    TorchScript scripts the plain module (DDP cannot be scripted); inductor compiles the
    strategy's wrapper so DDP's bucketing is visible to the compiler.
    """
    precision = settings["precision"]
    torch.manual_seed(config["seed"])
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model = workload.build_model().to(device)
    if precision == "bf16_weights":
        model = model.to(torch.bfloat16)
    start = time.perf_counter()
    if settings["compile"] == "torchscript":
        model = torch.jit.script(model)
    strategy = make_strategy(settings["sync"], settings["options"], device)
    model, optimizer = strategy.prepare(model, make_optimizer_factory(config))
    if settings["compile"] == "inductor":
        # Dynamo reuses code compiled for an earlier trial's module class (so compile_s would
        # read ~0) and, past its recompile limit, silently runs eager: start each trial clean.
        torch._dynamo.reset()
        model = torch.compile(model, mode=settings["options"]["compile_mode"])
    wrap_s = time.perf_counter() - start if settings["compile"] != "eager" else 0.0
    return model, optimizer, strategy, wrap_s


#: Interleaved pairs of (synced, no_sync) forward+backward passes run after the measured window.
CALIBRATION_PAIRS = 5


def rows_per_rank(config: dict[str, Any]) -> int:
    """Training rows the largest trial of a launch reads on one rank (warmup, measured steps
    with their micro-batches, exposed-communication calibration): how much data the launch's
    input streams in one pass, so that no epoch boundary falls inside a trial."""
    target = config["target"]
    steps = target["max_steps"] if target else config["warmup_steps"] + config["steps"]
    most = 0
    for trial in config["trials"]:
        s = trial["settings"]
        micro = s["options"]["accumulate_steps"] if s["sync"] == "accumulate" else 1
        passes = steps * micro + CALIBRATION_PAIRS
        most = max(most, passes * s["per_device_batch"])
    return most


def _exposed_communication(
    workload: Workload,
    model: torch.nn.Module,
    batches: Any,
    weights_dtype: torch.dtype | None,
    autocast_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler | None,
    clock: _Clock,
    settings: dict[str, Any],
) -> float | None:
    """Exposed gradient communication per step, estimated outside the measured window.

    Method: CALIBRATION_PAIRS interleaved pairs of forward+backward passes, one with DDP's
    gradient all-reduce and one under `no_sync()` (no all-reduce, no optimizer step, gradients
    discarded), on the same batches; exposed communication = median(synced) - median(no_sync),
    clipped at 0. It counts only the all-reduce time that backward could not hide, which is
    what costs throughput. Limits: only for strategies built on DDP (others report None and
    their communication shows up in optimizer time); not for compiled models (no_sync would
    recompile); noisy when the difference is below timer resolution.
    """
    ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
    if ddp is None or settings["compile"] == "inductor":
        return None
    timings: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(CALIBRATION_PAIRS):
        batch = next(batches)
        for synced in (True, False):
            context = contextlib.nullcontext() if synced else ddp.no_sync()
            x, y = workload.split_batch(batch)
            if weights_dtype is not None and x.is_floating_point():
                x = x.to(weights_dtype)
            with context:
                start = clock.mark()
                with torch.autocast(
                    x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
                ):
                    loss = workload.loss(model(x), y)
                (scaler.scale(loss) if scaler else loss).backward()
                end = clock.mark()
            ddp.zero_grad(set_to_none=True)
            timings[synced].append((start, end))
    if clock.cuda:
        torch.cuda.synchronize()
    spans = {k: statistics.median(clock.span(a, b) for a, b in v) for k, v in timings.items()}
    return max(0.0, spans[True] - spans[False])


_PEAK_CACHE: dict[tuple[str, torch.dtype, bool], float] = {}


def _peak_flops(device: torch.device, dtype: torch.dtype) -> float:
    """Measured matmul FLOP/s of this worker at `dtype` (cached per process), for MFU.

    Labelled as measured, not a datasheet figure: on CPU there is no honest datasheet peak for
    the threads a worker was given, and a measured peak is what the model could reach.
    """
    # tf32 trials compute in float32 with another matmul mode: a peak of their own.
    key = (str(device), dtype, torch.backends.cuda.matmul.allow_tf32)
    if key not in _PEAK_CACHE:
        # On GPU a matmul must be long enough (~1 ms at 8192^2 on an H100) that the
        # synchronisation every 4 of them does not count against the peak.
        n = 8192 if device.type == "cuda" else 512
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        sync = torch.cuda.synchronize if device.type == "cuda" else _nothing
        for _ in range(3):
            a @ b
        sync()
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.2:
            for _ in range(4):
                a @ b
            reps += 4
            sync()
        _PEAK_CACHE[key] = 2 * n**3 * reps / (time.perf_counter() - start)
    return _PEAK_CACHE[key]


class LRSchedule:
    """The trial's learning rate: linear scaling with gradual warmup (Goyal et al. 2017).

    peak = lr x effective batch / lr_base_batch under `lr_scaling: linear` (else lr); over the
    first `lr_warmup_steps` optimizer steps the rate ramps linearly from lr to peak. Set on the
    optimizer's param groups before its step (the parameter server forwards it to its shards).
    """

    def __init__(self, base: float, peak: float, warmup_steps: int):
        self.base, self.peak, self.warmup_steps = base, peak, warmup_steps

    @classmethod
    def for_trial(cls, config: dict[str, Any], effective_batch: int) -> LRSchedule:
        base = config["lr"]
        scale = effective_batch / config["lr_base_batch"] if config["lr_scaling"] == "linear" else 1
        return cls(base, base * scale, config["lr_warmup_steps"])

    def at(self, step: int) -> float:
        if step >= self.warmup_steps:
            return self.peak
        return self.base + (self.peak - self.base) * step / self.warmup_steps

    def update(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Set the rate for optimizer step `step` (0-based) while the ramp lasts; the call at
        step `warmup_steps` sets the peak, later calls return at once (the hot loop)."""
        if step > self.warmup_steps:
            return
        rate = self.at(step)
        for group in optimizer.param_groups:
            group["lr"] = rate


def target_label(target: dict[str, Any] | None) -> str | None:
    """`train.target` as the results table shows it, e.g. `val_accuracy>=0.9`."""
    if target is None:
        return None
    op = "<=" if target["metric"] == "val_loss" else ">="
    return f"{target['metric']}{op}{target['value']:g}"


def _target_reached(quality: tuple[float, float | None], target: dict[str, Any]) -> bool:
    """Whether validation (loss, accuracy) meets `train.target` (accuracy >=, loss <=)."""
    val_loss, val_acc = quality
    if target["metric"] == "val_loss":
        return val_loss <= target["value"]
    if val_acc is None:
        raise ValueError("train.target.metric val_accuracy: this workload reports no accuracy")
    return val_acc >= target["value"]


def make_optimizer_factory(config: dict[str, Any]):
    """params -> optimizer, as the sweep's train section asks (strategies may wrap or shard it)."""
    lr = config["lr"]
    if config["optimizer"] == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr)
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


@torch.no_grad()
def _evaluate(
    workload: Workload,
    model: torch.nn.Module,
    val: dict[str, np.ndarray],
    device: torch.device,
    rank: int,
    world: int,
    autocast_dtype: torch.dtype | None,
    weights_dtype: torch.dtype | None,
    batch_size: int,
) -> tuple[float, float | None]:
    """Validation loss/accuracy over the held-out split; each rank takes every world-th row.

    Every rank takes part (sharded models need all ranks for a forward), and the sums are
    all-reduced, so the figure covers the whole split.
    """
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
        batch = {k: torch.from_numpy(v[sel]).to(device) for k, v in val.items()}
        x, y = workload.split_batch(batch)
        if weights_dtype is not None and x.is_floating_point():
            x = x.to(weights_dtype)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model(x)
            loss = workload.loss(out, y)
        if not counted:
            continue
        loss_sum += float(loss) * len(sel)
        correct = workload.correct(out, y)
        has_accuracy = correct is not None
        if has_accuracy:
            correct_sum += float(correct)
    totals = torch.stack(
        [loss_sum, correct_sum, torch.tensor(float(len(idx)), dtype=torch.float64)]
    )
    if dist.is_initialized() and world > 1:
        totals = totals.to(device)  # NCCL reduces device tensors only
        dist.all_reduce(totals)  # sums, once per trial
        totals = totals.cpu()
    model.train(was_training)
    count = max(float(totals[2]), 1.0)
    return float(totals[0]) / count, (float(totals[1]) / count if has_accuracy else None)


# --------------------------------------------------------------------------- clocks and memory


class _Clock:
    """Phase marks: CUDA events on GPU (read once at the end), perf_counter on CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def span(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def resolve(self, steps: list[list[Any]]) -> list[dict[str, float]]:
        """Marks per step are [start, (after forward, after backward) per micro-step, end]."""
        if self.cuda:
            torch.cuda.synchronize()
        out = []
        for m in steps:
            spans = [self.span(a, b) for a, b in zip(m[:-1], m[1:], strict=True)]
            out.append(
                {
                    "forward": sum(spans[0:-1:2]),
                    "backward": sum(spans[1:-1:2]),
                    "optimizer": spans[-1],
                    "total": self.span(m[0], m[-1]),
                }
            )
        return out


def _memory_reset(device: torch.device) -> int:
    """Reset the peak counters; return the baseline to subtract (bytes still allocated: CUDA
    memory, or the CPU process's resident bytes). The previous trial's model and optimizer can
    live on in reference cycles: collect them first so they count in neither."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) for this process, Linux >= 4.0
    return _proc_status_bytes("VmRSS")


def _memory_peak(device: torch.device, baseline: int) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "peak_mem_bytes": float(max(0, torch.cuda.max_memory_allocated(device) - baseline)),
            "peak_mem_reserved_bytes": float(torch.cuda.max_memory_reserved(device)),
        }
    return {
        "peak_mem_bytes": float(max(0, _proc_status_bytes("VmHWM") - baseline)),
        "peak_mem_reserved_bytes": None,
    }


def _proc_status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _nothing() -> None:
    return None


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
            raise RankStranded(
                f"rank {dist.get_rank()} failed ({error.splitlines()[0]}) while "
                f"{world - arrived} other rank(s) were still in the trial's collectives; "
                "the worker group was stopped"
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


def _results_row(
    config: dict,
    trial: dict,
    repeat: int,
    ranks: list[dict],
    started: float,
    stamp: str,
    device: torch.device,
    threads: int,
) -> dict[str, Any]:
    s = trial["settings"]
    errors = [r["error"] for r in ranks if r["error"]]
    nodes = json.dumps([r.get("node") for r in ranks])
    row: dict[str, Any] = {
        "sweep": config["sweep"],
        "trial_id": trial["trial_id"],
        "repeat": repeat,
        "launch_id": config["launch_id"],
        "workload": config["workload"],
        "params": json.dumps(s["params"], sort_keys=True),
        **{k: s[k] for k in SETTING_COLUMNS},
        "batch_size": s["per_device_batch"],
        "scaling": config["scaling"],
        "steps": config["steps"],
        "target": target_label(config["target"]),
        "warmup_steps": config["warmup_steps"],
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "torch_threads": threads,
        "host": _stdlib_platform.node(),
        "versions": json.dumps(_versions()),
        "nodes": nodes,
        "started_at": stamp,
    }
    if errors:
        first = errors[0]
        row["status"] = "oom" if first.startswith("oom") else "failed"
        row["error"] = first
    else:
        row.update(_aggregate([r["stats"] for r in ranks], s, config))
    row["wall_s"] = time.perf_counter() - started
    return row


def _aggregate(stats: list[dict[str, Any]], settings: dict, config: dict) -> dict[str, Any]:
    """Per-rank measurements -> one row: throughput over all ranks, median and max per phase."""
    med = lambda k: statistics.median(r[k] for r in stats)  # noqa: E731
    top = lambda k: max(r[k] for r in stats)  # noqa: E731
    micro = stats[0]["micro_steps"]
    global_batch = settings["per_device_batch"] * len(stats) * micro
    window = top("window_s")
    measured_steps = stats[0]["measured_steps"]
    throughput = global_batch * measured_steps / window
    flops = config.get("flops_per_sample")
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
    }


def _versions() -> dict[str, str]:
    import ray

    return {
        "torch": torch.__version__,
        "ray": ray.__version__,
        "python": _stdlib_platform.python_version(),
        "cuda": torch.version.cuda or "",
        "omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
    }


def _is_host_oom(e: RuntimeError) -> bool:
    text = str(e)
    return "can't allocate memory" in text or "out of memory" in text.lower()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
