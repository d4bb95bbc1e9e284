"""Trials kept in their ranks between halving rungs, so that a promoted configuration continues
where its previous rung stopped instead of starting again (docs/architecture.md, "Search").

A ranking rung's item may ask for its trial to be kept (`WorkItem.keep`); the next rung's item
for the same configuration and repeat names it (`WorkItem.continues`). Every rank of the trial
keeps its own part (model, optimizer, sync wrapper, input feed, step record). Before a
continuation the trial's ranks agree that each of them still has it (one small all-reduce), so a
rank never continues what another dropped; otherwise all of them start it fresh, and the row
says why. What is kept is bounded by a memory budget (`RESIDENT_SHARE` of the device's memory,
or of the host's per worker on CPU), oldest first out; a kept trial whose rung two before the
current one is over can never be continued and is dropped; so is every kept trial when the
launch ends.
"""

from __future__ import annotations

import gc
import os
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist

from amdahl.protocol.items import WorkItem
from amdahl.worker.trial import KeptTrial

#: Share of a rank's memory (its GPU's, or on CPU the host's divided among the launch's
#: workers) that kept trials' model state may hold.
RESIDENT_SHARE = 0.25


class ResidentTrials:
    """This rank's kept trials, by item key, oldest first."""

    def __init__(self, device: torch.device, workers: int):
        self.budget_bytes = (
            RESIDENT_SHARE
            * _memory_bytes(device)
            / (1 if device.type == "cuda" else max(1, workers))
        )
        self._kept: OrderedDict[str, tuple[int, int, KeptTrial]] = OrderedDict()
        self._dropped: dict[str, str] = {}  # item key -> why it is no longer kept
        self._released = False  # a kept trial was let go (`thaw_if_released`)

    def take(
        self, item: WorkItem, devices: int, device: torch.device
    ) -> tuple[KeptTrial | None, str | None]:
        """The trial `item` continues, if every rank of its `devices` still holds it (a
        collective among them: every rank of the trial calls it), with None as the reason;
        else (None, why it starts fresh). A kept trial some other rank lacks is dropped here."""
        self._drop_finished_rungs(item.rung)
        key = item.continues
        if key is None:
            return None, None
        entry = self._kept.pop(key, None)
        everywhere = _all_ranks_agree(entry is not None, devices, device)
        if entry is not None and everywhere:
            return entry[2], None
        if entry is not None:
            self._release(entry[2])
            return None, f"{key} was no longer kept on every rank of the trial"
        why = self._dropped.get(key, "not kept in this worker group (started after it ran)")
        return None, f"{key}: {why}"

    def keep(self, item: WorkItem, kept: KeptTrial, state_bytes: int) -> None:
        """Keep `kept` for the next rung, making room within the budget (oldest out)."""
        if state_bytes > self.budget_bytes:
            self._release(kept)
            self._dropped[item.key] = _over_budget(state_bytes, self.budget_bytes)
            return
        while self._kept and self.held_bytes() + state_bytes > self.budget_bytes:
            old_key, (_, _, old) = self._kept.popitem(last=False)
            self._release(old)
            self._dropped[old_key] = "dropped to make room for later rungs' trials " + (
                _over_budget(self.held_bytes() + state_bytes, self.budget_bytes)
            )
        self._kept[item.key] = (item.rung if item.rung is not None else -1, state_bytes, kept)

    def refuse(self, item: WorkItem, why: str) -> None:
        """`item` asked to be kept and is not (`unkeepable`): the next rung says why."""
        self._dropped[item.key] = why

    def thaw_if_released(self) -> bool:
        """Whether a kept trial was let go since the last call: it had been frozen with the
        launch's heap (worker/harness.py freezes what survives each item), where the
        collector never looks, so its reference cycles (DDP's hooks, autograd's) would hold
        its memory, on a GPU too, for the rest of the launch. The harness then thaws and
        collects once (a full collection, ~0.2 s, between items), instead of leaking."""
        released, self._released = self._released, False
        if released:
            gc.unfreeze()
        return released

    def _release(self, kept: KeptTrial) -> None:
        kept.close()
        self._released = True

    def held_bytes(self) -> int:
        return sum(b for _, b, _ in self._kept.values())

    def close(self) -> None:
        """The launch ends: release every kept trial."""
        while self._kept:
            self._release(self._kept.popitem()[1][2])

    def _drop_finished_rungs(self, rung: int | None) -> None:
        """Rung r's items continue rung r-1's trials: those of earlier rungs are never used."""
        if rung is None:
            return
        for key in [k for k, (r, _, _) in self._kept.items() if r < rung - 1]:
            self._release(self._kept.pop(key)[2])
            self._dropped[key] = "its configuration was not promoted"


def unkeepable(source: Any) -> str | None:
    """Why a trial reading `source` is not kept between rungs, or None: a kept trial keeps its
    input iterator, which must hold no process and leave the source free for other trials."""
    from amdahl.worker.input import LaunchStream, LoaderSource, LocalShard

    if isinstance(source, LoaderSource) and source.workers > 0:
        return (
            f"not kept: input torch_loader with data_workers {source.workers} (a kept trial's "
            "DataLoader would keep its worker processes up; data_workers: 0 continues)"
        )
    if not isinstance(source, LoaderSource | LaunchStream | LocalShard):
        return (
            "not kept: its Ray Data shard is read through Ray's iterator (too large to hold "
            "in the worker), and a kept pass would run beside the next trial's"
        )
    return None


def _all_ranks_agree(mine: bool, devices: int, device: torch.device) -> bool:
    """Whether every rank of the trial's group says yes (a MIN all-reduce; alone: `mine`).
    On the rank's own device: NCCL reduces device tensors only."""
    if devices == 1 or not dist.is_initialized():
        return mine
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _memory_bytes(device: torch.device) -> int:
    """The device's memory: the GPU's total, or the host's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _over_budget(needed: float, budget: float) -> str:
    return (
        f"(kept trials' model state would be {needed / 2**20:.0f} MiB, over the "
        f"{budget / 2**20:.0f} MiB kept trials may hold on this rank)"
    )
