"""What this build or the device cannot run: a trial's capability check (`capability_problem`).

A value that needs CUDA on a CPU plan, a GPU share NCCL rejects, or two axis values that cannot
run together is refused here, at plan time, with the reason, so no launch starts a trial that
would fail (or hang) on the workers. The sync strategies' needs come from their table
(strategies.py). Pure: no Ray, no torch.
"""

from __future__ import annotations

from amdahl.columns import TrialSettings
from amdahl.spec.schema import SweepSpec
from amdahl.strategies import STRATEGIES

#: Values that need a CUDA device (and, for ddp_bf16, NCCL): refused on CPU with this reason. The
#: sync strategies' come from their table (strategies.py).
NEEDS_CUDA: dict[tuple[str, str], str] = {
    ("precision", "tf32"): "tf32 is a CUDA tensor-core math mode; set resources.use_gpu: true",
    **{("sync", n): s.needs_cuda for n, s in STRATEGIES.items() if s.needs_cuda},
}

#: Option values that need a CUDA device, refused on CPU with this reason (only in a trial that
#: reads the option: its settings hold only those).
OPTIONS_NEEDING_CUDA: dict[tuple[str, object], str] = {
    ("compile_mode", "reduce-overhead"): "reduce-overhead records CUDA graphs, which need a "
    "CUDA device; set resources.use_gpu: true, or use max-autotune-no-cudagraphs on CPU",
}

#: Combinations of axis values that cannot run together, with the reason; the sync strategies'
#: come from their table (seen on an H100: FSDP2's `fully_shard` registers forward pre-hooks,
#: which TorchScript modules refuse).
INCOMPATIBLE: dict[tuple[tuple[str, object], tuple[str, object]], str] = {
    (("data_workers", 0), ("input", "ray_data")): "Ray Data's preprocessing needs at least one "
    "task; 0 (batches made in the training process) is for input torch_loader",
    **{
        (("compile", "torchscript"), ("activation_checkpointing", mode)): "TorchScript cannot "
        "script the checkpoint wrapper (Python autograd hooks); use compile eager or inductor"
        for mode in ("full", "selective")
    },
    **{
        ((axis, value), ("sync", n)): reason
        for n, s in STRATEGIES.items()
        for axis, value, reason in s.incompatible
    },
}


def capability_problem(spec: SweepSpec, settings: TrialSettings) -> str | None:
    """Why a trial with these settings cannot run on what `spec` asks for (its device, its
    GPU share), or None."""
    gpus = spec.resources.gpus_per_device
    if spec.resources.use_gpu and gpus > 1:
        return (
            f"resources.gpus_per_device={gpus:g}: each train worker drives one GPU, so the "
            "others would sit idle; set it to 1 and raise grid.devices"
        )
    if spec.resources.use_gpu and gpus < 1 and settings.devices > 1:
        return (
            f"resources.gpus_per_device={gpus:g} with {settings.devices} devices: Ray may put "
            "two workers on one GPU, which NCCL rejects (duplicate GPU); use 1"
        )
    for (axis, value), reason in NEEDS_CUDA.items():
        if not spec.resources.use_gpu and getattr(settings, axis) == value:
            return f"{axis}={value}: {reason}"
    for (option, value), reason in OPTIONS_NEEDING_CUDA.items():
        if not spec.resources.use_gpu and settings.options.get(option) == value:
            return f"options.{option}={value}: {reason}"
    for (a, b), reason in INCOMPATIBLE.items():
        if getattr(settings, a[0]) == a[1] and getattr(settings, b[0]) == b[1]:
            return f"{a[0]}={a[1]} with {b[0]}={b[1]}: {reason}"
    own = STRATEGIES[settings.sync].micro_steps_option
    if own and settings.accumulate_steps != 1:
        return (
            f"sync={settings.sync} with accumulate_steps={settings.accumulate_steps}: "
            f"{settings.sync} accumulates options.{own} micro-batches itself; use sync ddp "
            "with grid.accumulate_steps"
        )
    return None


def alias_note(spec: SweepSpec) -> str | None:
    """The line `platform plan` prints for a sweep that uses a strategy which is only an older
    spelling of another's with the `accumulate_steps` axis (`sync: accumulate`), or None."""
    old = [n for n in spec.grid.sync if STRATEGIES[n].micro_steps_option]
    if not old:
        return None
    return (
        f"sync {', '.join(old)}: still runs as before; grid.accumulate_steps with sync ddp "
        "does the same, and with any other sync too"
    )
