"""A trial's memory, as tensor bytes: what a device would have to hold, on CPU as on a GPU.

On a GPU the caching allocator counts every tensor byte (`torch.cuda.max_memory_allocated`),
so the peak over the trial is read from it. On CPU no allocator keeps such a count, and the
process's resident memory is no stand-in: on a small transformer it read about 2.1x the tensor
bytes torch's own MemTracker measured (allocator caches, arenas, the input pipeline's buffers).
So one step of each trial, outside its measured window (the last warmup step, or one more
untimed step after the window: `StepMemory`), runs under `TensorLedger`, a dispatch mode that
counts every tensor storage alive during it, by what it holds: parameters, gradients,
optimizer state, activations (made in the forward), temporaries (made in the backward and the
optimizer step) and other (module buffers, a sync strategy's own buffers such as DDP's
gradient buckets). The ledger is MemTracker's
method (storages keyed weakly, `resize_` watched for FSDP2's unsharded parameters) without its
per-module bookkeeping; tests/unit/worker/test_tensor_ledger.py checks it against MemTracker.

What it cannot see: storages made outside torch's dispatcher. Inductor's generated CPU code
allocates its buffers directly, so a compiled trial on CPU has no tensor-byte peak (null, never
a figure that is too low). Resident memory stays as its own column (`peak_rss_bytes`).

Worker side: imports torch, never ray.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

#: The ledger's categories, in the order the row's columns list them (`mem_<category>_bytes`).
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries", "other")

#: The results columns this module fills, besides `peak_mem_bytes` and `peak_rss_bytes`.
BREAKDOWN_COLUMNS = tuple(f"mem_{c}_bytes" for c in CATEGORIES)
#: Every memory column a trial measures: what a halving continuation takes from its first item.
MEMORY_COLUMNS = ("peak_mem_bytes", "peak_mem_reserved_bytes", "peak_rss_bytes", *BREAKDOWN_COLUMNS)


class TensorLedger(TorchDispatchMode):
    """Live tensor bytes by category while active, and their peak.

    `seed` enters what exists before the step (parameters, optimizer state, ...); every storage
    an operator returns afterwards is entered by where it was made (`_phase`: the forward's are
    activations, the backward's and the optimizer step's temporaries) and leaves when it is
    freed (a weak reference's callback). A storage is counted once, whatever views share it."""

    def __init__(self) -> None:
        super().__init__()
        self.in_optimizer = False
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.peak = 0
        self.at_peak = dict(self.live)
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: list[weakref.ref] = []
        self._resize: Callable | None = None

    # ----------------------------------------------------------------- what is entered

    def seed(self, category: str, tensors: Any) -> None:
        """Enter the storages of every tensor in `tensors` (any nesting) under `category`;
        one already entered moves to it."""
        tree_map_only(torch.Tensor, lambda t: self._enter(t, category, move=True), tensors)
        self._note_peak()

    def add_fixed(self, category: str, nbytes: int) -> None:
        """Bytes a component holds where no Python tensor shows them (DDP's bucket copies)."""
        self.live[category] += nbytes
        self._note_peak()

    def reclassify(self, tensor: torch.Tensor | None, category: str) -> None:
        """A storage entered under one category turned out to be another (a backward
        temporary that became a parameter's gradient)."""
        if tensor is not None:
            self.seed(category, tensor)

    @property
    def total(self) -> int:
        return sum(self.live.values())

    def _enter(self, t: torch.Tensor, category: str, move: bool = False) -> None:
        for st in _storages(t):
            entry = self._entries.get(st)
            if entry is None:
                self._track(st, category)
            elif move and entry[1] != category:
                self.live[entry[1]] -= entry[0]
                self.live[category] += entry[0]
                entry[1] = category

    def _track(self, st: torch.UntypedStorage, category: str) -> None:
        if st.device.type == "meta":
            return
        entry = [st.nbytes(), category]
        self._entries[st] = entry
        self.live[category] += entry[0]
        self._refs.append(weakref.ref(st, lambda _, e=entry: self._leave(e)))

    def _leave(self, entry: list) -> None:
        self.live[entry[1]] -= entry[0]
        entry[0] = 0

    def _resized(self, st: torch.UntypedStorage) -> None:
        """A storage grew or shrank in place: FSDP2 frees an unsharded parameter by resizing
        it to 0 and allocates it again by resizing it back (storages `resize_` does not go
        through the dispatcher, so the mode never sees it)."""
        entry = self._entries.get(st)
        if entry is None:
            self._track(st, self._phase())
            return
        self.live[entry[1]] += st.nbytes() - entry[0]
        entry[0] = st.nbytes()

    def _phase(self) -> str:
        """Where a new storage is being made: inside autograd's backward (the engine has a
        graph task on this thread) or the optimizer's step, or else in the forward."""
        backward = torch._C._current_graph_task_id() != -1
        return "temporaries" if backward or self.in_optimizer else "activations"

    def _note_peak(self) -> None:
        total = self.total
        if total > self.peak:
            self.peak, self.at_peak = total, dict(self.live)

    # ----------------------------------------------------------------- the mode

    def __enter__(self) -> TensorLedger:
        original = torch.UntypedStorage.resize_
        self._resize = original
        ledger = self

        def resize_(st: torch.UntypedStorage, size: int) -> Any:
            out = original(st, size)
            ledger._resized(st)
            ledger._note_peak()
            return out

        torch.UntypedStorage.resize_ = resize_  # FSDP2 (un)shards parameters by resizing
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        torch.UntypedStorage.resize_ = self._resize
        super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor run its local ops, which the ledger sees
        out = func(*args, **(kwargs or {}))
        phase = self._phase()
        tree_map_only(torch.Tensor, lambda t: self._enter(t, phase), out)
        self._note_peak()
        return out


def _storages(t: torch.Tensor) -> set[torch.UntypedStorage]:
    """The storages behind `t`: its own, or those of a wrapper subclass's inner tensors
    (a DTensor's local shard), as MemTracker finds them."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    return get_untyped_storages(t)


# --------------------------------------------------------------------------- the tracked step


@contextlib.contextmanager
def tracked_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, fixed_other_bytes: int
) -> Iterator[TensorLedger]:
    """A ledger seeded with what exists before a step: `model`'s parameters (gradients, if any
    are left) and buffers, `optimizer`'s state, and `fixed_other_bytes` a sync strategy holds
    where no tensor shows it. The step run inside enters the rest; a parameter's gradient is
    recategorised as it accumulates."""
    ledger = TensorLedger()
    params = list(model.parameters())
    ledger.seed("parameters", params)
    ledger.seed("other", list(model.buffers()))
    ledger.seed("gradients", [p.grad for p in params if p.grad is not None])
    ledger.seed("optimizer", _optimizer_state(optimizer))
    ledger.add_fixed("other", fixed_other_bytes)
    hooks = [
        p.register_post_accumulate_grad_hook(lambda p: ledger.reclassify(p.grad, "gradients"))
        for p in params
        if p.requires_grad
    ]
    hooks.append(register_optimizer_step_pre_hook(lambda *_: setattr(ledger, "in_optimizer", True)))
    hooks.append(
        register_optimizer_step_post_hook(lambda *_: setattr(ledger, "in_optimizer", False))
    )
    try:
        with ledger:
            yield ledger
    finally:
        for hook in hooks:
            hook.remove()


#: The first loop step whose tensors are as every later step's (see StepMemory).
FIRST_SETTLED_STEP = 2


class StepMemory:
    """Which step of a trial the ledger counts, and its ledger once it has.

    The last warmup step where there are three or more: by then the optimizer state exists
    (made in the first step) and DDP has rebuilt its gradient buckets (in the second step's
    forward, in the order the first backward made the gradients: counted there, the new
    buckets would stand beside the old ones); the step is outside the measured window, and
    one the trial runs anyway, so counting it leaves the trial's training untouched (a halving
    rung's kept trial continues as an uninterrupted one does). With fewer warmup steps, one
    more untimed step after the window (`ledger_after`). Not at all for an inductor trial:
    its generated code allocates where the ledger cannot see, and a figure that is too low
    is worse than none."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int,
        counted: bool,
    ):
        self.model, self.optimizer, self.counted = model, optimizer, counted
        self.step = warmup_steps - 1 if warmup_steps >= FIRST_SETTLED_STEP + 1 else None
        self.ledger: TensorLedger | None = None

    def during(self, step: int) -> contextlib.AbstractContextManager:
        """The ledger around loop step `step` if it is the one counted, else nothing."""
        if not self.counted or step != self.step:
            return contextlib.nullcontext()
        return self._count()

    def ledger_after(self, run_step: Callable[[], None]) -> TensorLedger | None:
        """The ledger, counting MEMORY_STEPS more steps (`run_step`) now where the loop had
        none to count."""
        from amdahl.protocol.sizing import MEMORY_STEPS

        if self.counted and self.ledger is None:
            with self._count():
                for _ in range(MEMORY_STEPS):
                    run_step()
        return self.ledger

    @contextlib.contextmanager
    def _count(self) -> Iterator[None]:
        with tracked_step(self.model, self.optimizer, sync_buffer_bytes(self.model)) as ledger:
            yield
        self.ledger = ledger


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state this rank holds (ZeroRedundancyOptimizer: its own
    partition's, in the local optimizer it wraps)."""
    inner = getattr(optimizer, "optim", optimizer)
    return [
        v
        for per_param in inner.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor)
    ]


def sync_buffer_bytes(model: torch.nn.Module) -> int:
    """Bytes a sync strategy's wrapper holds where no Python tensor shows them: DDP's gradient
    buckets, one flat copy of the gradients allocated in C++ when it is built (none when the
    gradients are views into the buckets). Its own logging data says how large they are."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return 0
    data = model._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    sizes = str(data.get("bucket_sizes", ""))
    return sum(int(s) for s in sizes.split(",") if s.strip())


def ledger_columns(ledger: TensorLedger | None) -> dict[str, float | None]:
    """The breakdown columns at the ledger's peak (null without a ledger)."""
    if ledger is None:
        return dict.fromkeys(BREAKDOWN_COLUMNS)
    return {f"mem_{c}_bytes": float(ledger.at_peak[c]) for c in CATEGORIES}


# --------------------------------------------------------------------------- device counters


def memory_reset(device: torch.device) -> int:
    """Reset the peak counters; return the baseline to subtract (bytes still allocated: CUDA
    memory, or the CPU process's resident bytes). The previous trial's model and optimizer can
    live on in reference cycles: collect them first so they count in neither."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) for this process, Linux >= 4.0
    return _proc_status_bytes("VmRSS")


def memory_peak(
    device: torch.device, baseline: int, ledger: TensorLedger | None
) -> dict[str, float | None]:
    """The trial's memory columns: `peak_mem_bytes` as tensor bytes (CUDA's allocated peak
    above the baseline; on CPU the ledger's peak, null without one), the breakdown at the
    ledger's peak, CUDA's reserved peak, and on CPU the resident peak above the baseline."""
    columns = ledger_columns(ledger)
    if device.type == "cuda":
        columns["peak_mem_bytes"] = float(
            max(0, torch.cuda.max_memory_allocated(device) - baseline)
        )
        columns["peak_mem_reserved_bytes"] = float(torch.cuda.max_memory_reserved(device))
        columns["peak_rss_bytes"] = None
        return columns
    columns["peak_mem_bytes"] = float(ledger.peak) if ledger is not None else None
    columns["peak_mem_reserved_bytes"] = None
    columns["peak_rss_bytes"] = float(max(0, _proc_status_bytes("VmHWM") - baseline))
    return columns


def _proc_status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
