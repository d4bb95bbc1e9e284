"""FLOPs per sample counted, not stated: the MFU numerator's work, as torch executes it.

A hand-stated figure is easy to get wrong (the D2L MLP's 6 x MACs counts the first layer's
input gradient, which autograd never computes: 1.36x too high) and nothing checks it. So every
trial's figure is counted: torch's `FlopCounterMode` over what one training step executes on
the trial's plain model (no compiler, no sync-strategy wrapper) on the trial's device and one of
the trial's own batches, forward, loss and backward (not the optimizer: its element-wise
updates are no matmul work), divided by the batch's rows. The workload's `flops_per_sample`
stays as an optional stated figure: a cross-check the report compares with the count, and the
figure MFU uses where the workload sets `flops_override` (work the counter cannot see) or where
counting failed (`flops_figures`).

What the count depends on, and so its cache key (one count per worker process, i.e. per launch,
per key): the workload class and its params (they build the model and decide the data, so the
per-sample input shapes). Not the trial's precision (autocast and bf16 weights
change the dtype of a matmul, not its FLOPs), compilation (inductor fuses element-wise work,
which the counter does not count, and keeps the matmuls), the sync strategy (a wrapper adds
communication, not matmuls), the per-device batch (every counted op is linear in the rows) or
micro-steps (FLOPs per sample are the same per micro-batch). A workload whose per-sample input
shape changes from batch to batch (padded to each batch's longest sequence) is counted on one.

What torch counts: matmuls, convolutions and attention, as 2 FLOPs per multiply-accumulate;
element-wise work, norms and the loss's reductions are not counted, which is MFU's usual
convention. Attention is counted over the full (not the causal half) matrix, two ways (PaLM,
appendix B): the model's FLOPs (`Counted.model`, MFU's numerator), and the hardware's
(`Counted.hardware`, HFU's), which add the fused kernels' recomputation of the scores in their
backward, as torch's formula for them counts it. torch
2.13 has no formula for the CPU flash-attention kernel, so attention on CPU would count as zero
(8% of the GPT workload's work would vanish): `_CPU_ATTENTION` gives it torch's own formulas for
the CUDA kernels, so a CPU and a GPU trial count the same figure.

Runs after the trial's measured window and its side measurements (worker/trial.py), on rank 0
only (only rank 0's figure reaches the row), never inside a timed phase; its seconds are the
row's `flops_count_s`. A count that fails (say the plain, unsharded model does not fit on one
device) leaves the trial measured, with the stated figure if the workload has one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.flop_counter as flop_counter
from torch.utils._pytree import tree_leaves

from amdahl.worker.checkpointing import apply_checkpointing
from amdahl.worker.user_output import printed_once
from amdahl.workload.api import Workload

_CACHE: dict[tuple, Counted | None] = {}


def _attention(query: Any, key: Any, value: Any, *_: Any, out_shape: Any = None, **__: Any) -> int:
    return flop_counter.sdpa_flop_count(query, key, value)


def _attention_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *_: Any, out_shape: Any = None, **__: Any
) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out, query, key, value)


def _cpu_attention() -> dict[Any, Any]:
    """torch's own SDPA formulas for the CPU flash-attention kernels it has none for (the
    schemas: query, key, value first; the backward's grad_out before them)."""
    aten = torch.ops.aten
    ops = {
        "_scaled_dot_product_flash_attention_for_cpu": _attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    }
    mapping = {}
    for name, formula in ops.items():
        op = getattr(aten, name, None)
        if op is not None and op not in flop_counter.flop_registry:
            mapping[op] = formula
    return mapping


_CPU_ATTENTION = _cpu_attention()


@dataclass(frozen=True)
class Counted:
    """FLOPs per sample of one training step, as the model defines them and as executed."""

    #: the model's: what the step must compute (MFU's numerator)
    model: float
    #: as the kernels execute them: the model's plus the fused attention backward's
    #: recomputed scores (HFU's numerator); equal to `model` where nothing is recomputed
    hardware: float


def count_training_flops(
    workload: Workload, batch: dict[str, torch.Tensor], checkpointing: str = "none"
) -> Counted:
    """FLOPs per sample of one training step's forward, loss and backward (not the optimizer)
    on a fresh plain model of `workload`, in float32 and in training mode, on the device the
    batch is on. Torch's random state is left as it was (the model's initialisation and any
    dropout draw from a forked generator). With activation `checkpointing`, the hardware's
    figure is the checkpointed model's (its backward runs the blocks' forward again) and the
    model's is the plain one's: MFU stays the model's, HFU shows the recomputation."""
    plain = _count(workload, batch, "none")
    if checkpointing == "none":
        return plain
    return Counted(plain.model, _count(workload, batch, checkpointing).hardware)


def _count(workload: Workload, batch: dict[str, torch.Tensor], checkpointing: str) -> Counted:
    device = next(iter(batch.values())).device
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        with printed_once():
            model = workload.build_model().to(device)
        model = apply_checkpointing(workload, model, checkpointing)
        model.train()
        inputs, targets = workload.split_batch(batch)
        rows = _rows(inputs)
        with flop_counter.FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION) as c:
            workload.forward(model, inputs, targets)[1].backward()
    hardware = c.get_total_flops()
    return Counted((hardware - _recomputed(c.get_flop_counts())) / rows, hardware / rows)


def _recomputed(counts: dict[str, dict[Any, int]]) -> float:
    """FLOPs the fused attention kernels' backward spends recomputing the scores: torch's
    formula (`flop_counter.sdpa_backward_flop_count`) counts four gradient products and one
    recomputed q @ k^T, all of one size where queries and values have one width (as in every
    transformer here), so a fifth of each backward's count. The unfused (math) path saves the
    scores instead and shows no such op."""
    ops = counts.get("Global", {})
    return sum(n / 5 for op, n in ops.items() if _is_fused_attention_backward(str(op)))


def _is_fused_attention_backward(name: str) -> bool:
    return "attention" in name and name.endswith("backward")


def counted_flops(
    workload: Workload,
    next_batch: Callable[[], dict[str, torch.Tensor]],
    checkpointing: str = "none",
) -> tuple[Counted | None, float]:
    """(FLOPs per sample, seconds spent now): counted once per process and `count_key` on the
    batch `next_batch()` gives (asked for only then), 0.0 seconds where it had been. None where
    counting failed or counted nothing (no op with a FlopCounterMode formula), with the reason
    on stderr: a side measurement never fails the trial it follows."""
    key = (*count_key(workload), checkpointing)
    if key in _CACHE:
        return _CACHE[key], 0.0
    start = time.perf_counter()
    name = type(workload).__name__
    per_sample: Counted | None = None
    try:
        batch = next_batch()
        counted = count_training_flops(workload, batch, checkpointing)
        per_sample = counted if counted.hardware > 0 else None
        if per_sample is None:
            print(
                f"amdahl: FlopCounterMode counted no FLOPs in {name}'s training step (no op "
                "it has a formula for); MFU uses its stated flops_per_sample, if any",
                file=sys.stderr,
            )
        device = next(iter(batch.values())).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - a side measurement: the trial is measured already
        print(
            f"amdahl: counting {name}'s FLOPs failed ({type(e).__name__}: {e}); MFU uses its "
            "stated flops_per_sample, if any",
            file=sys.stderr,
        )
    _CACHE[key] = per_sample
    return per_sample, time.perf_counter() - start


def count_key(workload: Workload) -> tuple[str, str]:
    """What decides the count: the workload class and its params, which build the model and
    decide its data (see the module docstring for what does not)."""
    cls = type(workload)
    return f"{cls.__module__}:{cls.__qualname__}", json.dumps(
        workload.params, sort_keys=True, default=repr
    )


def _rows(inputs: Any) -> int:
    """The batch's rows: the leading dimension of the model's (first) input tensor."""
    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not tensors:
        raise ValueError("split_batch gave no input tensor with a batch dimension")
    return int(tensors[0].shape[0])


def flops_figures(counted: Counted | None, stated: float | None, override: bool) -> dict[str, Any]:
    """The row's FLOPs columns: the figure MFU uses (`flops_per_sample`, model FLOPs), which one
    it is (`flops_source`), both figures, and the counted hardware FLOPs (HFU's numerator).
    The counted one, unless the workload's stated figure overrides it
    (`Workload.flops_override`) or nothing was counted; null where neither exists."""
    stated = float(stated) if stated is not None and stated > 0 else None
    model = counted.model if counted is not None else None
    if stated is not None and (override or counted is None):
        used, source = stated, "stated"
    elif model is not None:
        used, source = model, "counted"
    else:
        used, source = None, None
    return {
        "flops_per_sample": used,
        "flops_source": source,
        "flops_counted": model,
        "flops_hardware": counted.hardware if counted is not None else None,
        "flops_stated": stated,
    }
