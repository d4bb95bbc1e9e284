"""The parts of a trial that are not its timed loop: precision, learning-rate schedule,
optimizer, memory counters, per-trial resets of process-wide state, and failure classes.

Worker side (imports torch). The loop in trial.py reads in one sitting because these live
here; each is small and tested on its own (docs/architecture.md, "The worker side").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from amdahl.spec.schema import TargetSpec, TrainSpec

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------- precision


@dataclass(frozen=True)
class Precision:
    """One value of the precision axis, as the loop applies it.

    fp32 and tf32 compute in float32 (tf32 lets CUDA matmuls and convolutions use TF32 tensor
    cores, set by `tf32_flags`); bf16 and fp16 are autocast (fp16 with a loss scaler, since its
    gradients underflow); bf16_weights casts the model and its float inputs to bfloat16.
    """

    name: str
    autocast_dtype: torch.dtype | None
    weights_dtype: torch.dtype | None

    @classmethod
    def of(cls, name: str) -> Precision:
        return cls(name, _AUTOCAST.get(name), torch.bfloat16 if name == "bf16_weights" else None)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matmuls run in: the one the peak FLOP/s is measured at."""
        return self.autocast_dtype or self.weights_dtype or torch.float32

    def cast_input(self, x: Any) -> Any:
        """The model's inputs in its weights' dtype (bf16_weights): every floating-point
        tensor of them, a dict's or a tuple's too; the rest (token ids, ...) as they are."""
        if self.weights_dtype is None:
            return x
        dtype = self.weights_dtype
        cast = lambda t: t.to(dtype) if t.is_floating_point() else t  # noqa: E731
        return tree_map_only(torch.Tensor, cast, x)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """torch.autocast for bf16 and fp16; else no context at all: entering a disabled
        autocast still costs ~3 us a forward on CPU, beside a plain loop that has none."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype)

    def scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(device.type) if self.name == "fp16" else None


@contextlib.contextmanager
def tf32_flags(enabled: bool) -> Iterator[None]:
    """TF32 for CUDA matmuls and cuDNN inside the block; the process's flags come back after,
    whatever happens (a later fp32 trial must not silently run in TF32)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# --------------------------------------------------------------------------- learning rate


class LRSchedule:
    """The trial's learning rate: linear scaling with gradual warmup (Goyal et al. 2017).

    peak = lr x effective batch / lr_base_batch under `lr_scaling: linear` (else lr); over the
    first `lr_warmup_steps` optimizer steps the rate ramps linearly from lr to peak. Set on the
    optimizer's param groups before its step (the parameter server forwards it to its shards).
    """

    def __init__(self, base: float, peak: float, warmup_steps: int):
        self.base, self.peak, self.warmup_steps = base, peak, warmup_steps

    @classmethod
    def for_trial(cls, train: TrainSpec, effective_batch: int) -> LRSchedule:
        base = train.lr
        scale = effective_batch / train.lr_base_batch if train.lr_scaling == "linear" else 1
        return cls(base, base * scale, train.lr_warmup_steps)

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


def make_optimizer_factory(train: TrainSpec):
    """params -> optimizer, as the sweep's train section asks (strategies may wrap or shard it)."""
    lr = train.lr
    if train.optimizer == "adamw":
        return lambda params: torch.optim.AdamW(params, lr=lr)
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def target_reached(quality: tuple[float, float | None], target: TargetSpec) -> bool:
    """Whether validation (loss, accuracy) meets `train.target` (accuracy >=, loss <=)."""
    val_loss, val_acc = quality
    if target.metric == "val_loss":
        return val_loss <= target.value
    if val_acc is None:
        raise ValueError("train.target.metric val_accuracy: this workload reports no accuracy")
    return val_acc >= target.value


# --------------------------------------------------------------------------- per-trial resets


def reset_process_state() -> None:
    """Forget what an earlier trial of this process compiled, so that each trial compiles (and
    is measured) as if it ran alone. Runs before the memory baseline is taken, so that an
    earlier trial's compiled graphs and CUDA-graph pools count in no later trial."""
    import sys

    if "torch._dynamo" in sys.modules:
        # Dynamo reuses code compiled for an earlier trial's module class (so compile_s would
        # read ~0) and, past its recompile limit, silently runs eager.
        torch._dynamo.reset()
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None:
        trees.reset_cudagraph_trees()
    # TorchScript compiles each module type's methods once per process and keeps their
    # executors, whose optimised plans bake in the autocast dtype they were first profiled
    # under: an fp16 trial after a bf16 one failed in backward with "Half != BFloat16".
    # Forget the compiled types so each trial scripts (and profiles) its model afresh.
    torch._C._jit_clear_class_registry()
    torch.jit._recursive.concrete_type_store = torch.jit._recursive.ConcreteTypeStore()
    torch.jit._state._clear_class_state()


@contextlib.contextmanager
def compile_caches(cold: bool, own: Path | None = None) -> Iterator[None]:
    """Inductor's and Triton's on-disk caches for one trial: `cold` gives the trial fresh,
    empty cache directories (and clears inductor's in-memory caches), so compile_s counts every
    compilation, whichever trial or repeat ran before; warm leaves the shared caches as they
    are (what a user's second run sees). `own` is the directory a search's compiled
    configuration compiles into at every rung (worker/compile_dirs.py): empty at its first rung
    (as cold), its own graphs at later ones. The row records which one was measured."""
    if own is not None:
        with _inductor_cache_dir(own):
            yield
        return
    if not cold:
        yield
        return
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield


@contextlib.contextmanager
def _inductor_cache_dir(path: Path) -> Iterator[None]:
    """Inductor's and Triton's caches in `path`, kept after (fresh_cache's, not deleted), and
    inductor's in-memory caches cleared before and after, as fresh_cache does."""
    from torch._inductor.utils import clear_caches

    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    before = {name: os.environ.get(name) for name in names}
    clear_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        clear_caches()


# --------------------------------------------------------------------------- failures

#: Text of allocation failures that torch raises as RuntimeError rather than OutOfMemoryError.
_OOM_TEXT = (
    "out of memory",
    "can't allocate memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_not_enough_workspace",
)
#: Errors after which the process's CUDA context or NCCL communicator is unusable: every later
#: kernel or collective of the process fails too (CUDA errors are sticky), so the worker must
#: end after recording the trial, and the next trials run in a fresh worker group.
_POISON_TEXT = (
    "illegal memory access",
    "illegal instruction",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "nccl error",
    "ncclsystemerror",
    "ncclinternalerror",
    "ncclremoteerror",
    "watchdog",
    "process group has been aborted",
    "communicator was aborted",
)


#: A gloo connection's I/O failing (not a timeout): the peer's end is gone, because its process
#: died (a crash, the OOM killer) or Ray Train destroyed the process group to stop the worker
#: group. Every later collective of this process fails at once (measured: an all-gather after
#: "Connection closed by peer" raised in under 1 ms).
_PEER_LOST_TEXT = ("closed by peer", "reset by peer", "read error", "write error", "broken pipe")


def failure_kind(e: BaseException) -> str:
    """'oom', 'peer_lost' (a rank of the trial's world is gone: the world is broken, whichever
    trial runs on it), 'poisoned' (the process cannot run another trial) or 'failed'."""
    text = str(e).lower()
    if isinstance(e, torch.OutOfMemoryError) or any(t in text for t in _OOM_TEXT):
        return "oom"
    if "gloo/transport" in text and any(t in text for t in _PEER_LOST_TEXT):
        return "peer_lost"
    accelerator_error = getattr(torch, "AcceleratorError", ())
    dist_backend_error = getattr(torch.distributed, "DistBackendError", ())
    if isinstance(e, accelerator_error) or isinstance(e, dist_backend_error):
        return "poisoned"
    if any(t in text for t in _POISON_TEXT):
        return "poisoned"
    return "failed"


class ProcessPoisoned(RuntimeError):
    """A trial hit an error that leaves this process's CUDA context or communicator unusable.

    Raised after the trial's failure is known, so that Ray Train ends the worker group: the
    driver records that trial as failed with this message, and the trials the launch had not
    reached run in a new worker group (driver/sweep.py, relaunch)."""


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def process_versions() -> dict[str, str]:
    import platform as stdlib_platform

    versions = {
        "torch": torch.__version__,
        "python": stdlib_platform.python_version(),
        "cuda": torch.version.cuda or "",
        "omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
    }
    with contextlib.suppress(ImportError):
        import ray

        versions["ray"] = ray.__version__
    return versions
