"""Activation checkpointing (`grid.activation_checkpointing`) over the blocks a workload names.

Applied to the plain model, before the sync wrapper and the compiler (torchtitan's order:
FSDP2 then shards the wrapped blocks, inductor traces through the checkpoints). PyTorch's
non-reentrant checkpoint (`use_reentrant=False`, the one torch recommends): a wrapped block
keeps only its inputs through the forward and runs its forward again inside the backward, so
the counted hardware FLOPs carry the recomputation (worker/flops.py) while the model's do not.
`full` wraps every block; `selective` every other one, from the first (a rule of layers, like
torchtitan's `selective_ac_option: "2"`, not its op-level selection).
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from amdahl.workload.api import Workload

#: Every `stride`-th block is checkpointed, by mode.
STRIDE = {"full": 1, "selective": 2}


def checkpointed_blocks(
    workload: Workload, model: torch.nn.Module, mode: str
) -> list[torch.nn.Module]:
    """The blocks `mode` checkpoints (none for `none`); an error where the workload names none."""
    if mode == "none":
        return []
    blocks = workload.blocks(model)
    if not blocks:
        raise ValueError(
            f"activation_checkpointing={mode}: {type(workload).__name__}.blocks(model) names no "
            "blocks; return the modules to checkpoint (e.g. a transformer's layers)"
        )
    return blocks[:: STRIDE[mode]]


def apply_checkpointing(workload: Workload, model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """`model` with the blocks `mode` checkpoints wrapped in place (returned for chaining)."""
    chosen = checkpointed_blocks(workload, model, mode)
    if chosen:
        ids = {id(b) for b in chosen}
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            check_fn=lambda m: id(m) in ids,
        )
    return model
