"""Per-trial process groups: one worker group runs the trials of several device counts.

Starting a Ray Train worker group costs seconds (new processes for the Tune trainable, the Train
controller and every worker, then the process group), and a sweep over devices 1-2-4 paid it once
per device count. On a single node a launch now holds as many workers as its largest trial, and a
trial on d devices runs on ranks 0..d-1 with a default process group of exactly those d ranks,
made from the launch's own group (`new_group`) the first time a trial of that size runs and kept
for the launch: a later trial of the same size switches the default group back to it instead of
building one again. The sync strategies (DDP, ZeRO, FSDP2, PowerSGD, local SGD) keep using the
default group, unchanged, so a d-device trial runs as a d-worker launch would: the same ranks on
the same node, the same backend, and no collective ever reaches an idle rank. The other ranks skip
the trial and wait in its report barrier (Ray Train's, a blocking wait that takes no CPU from the
measured ranks). Keeping each size's group alive is also what lets a halving rung continue a trial
kept from the rung before (worker/resident.py): its DDP reducer or ZeRO optimizer holds the group
it was built with, which a rebuild would have destroyed.

Every rank calls `enter` for every trial in the same order, so all agree on each group's name
(an earlier version made each size's group with `init_process_group` on its ranks only, which
numbers groups per process: kept alive, ranks idle for one size disagreed on the next one's name).
Each group times out as the launch says (`LaunchConfig.collective_timeout_s`, which the driver
sets by protocol.contract.collective_timeout_s).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


class TrialWorlds:
    """This rank's view of the launch's default process group, one per trial size."""

    def __init__(self, rank: int, size: int, timeout_s: int, device: Any = None):
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self.device = device  # where the group's tensors live (NCCL: this rank's GPU)
        self.launch_size = size
        #: size -> this rank's group of that size (None where the rank is not in it); the
        #: launch's own (Ray Train's) group is the first.
        self._groups: dict[int, Any] = {size: dist.group.WORLD} if dist.is_initialized() else {}

    def enter(self, size: int) -> bool:
        """Make the default group span ranks 0..size-1; returns whether this rank takes part.

        Collective in effect: every rank calls it with the same sizes in the same order, after
        the previous trial's report (so no rank is still inside the old group's collectives).
        A size seen before switches back to its group; a new size builds one.
        """
        if size == self.size:
            return self.rank < size
        if not self._groups:
            raise RuntimeError(
                f"a trial on {size} devices in a launch of {self.size} workers needs the "
                "launch's process group, and there is none"
            )
        c10d = dist.distributed_c10d
        if size not in self._groups:
            # Made from the launch's whole group, which every rank is in, by every rank.
            c10d._update_default_pg(self._groups[self.launch_size])
            self.align_group_names()
            group = dist.new_group(list(range(size)), timeout=timedelta(seconds=self.timeout_s))
            self._groups[size] = group if self.rank < size else None
        c10d._update_default_pg(self._groups[size])
        self.size = size
        return self.rank < size

    def align_group_names(self) -> None:
        """Make every rank's next `new_group` name the same: torch names groups by a per-process
        count, which a group made on some ranks only (FSDP2's device mesh on gloo where CUDA is
        visible) advances on those ranks alone, and a later group made by every rank could then
        meet under different names. A guard: tests/unit/worker/test_worlds.py makes such a
        group and passed on torch 2.13 with or without it. A MAX all-reduce of the counts over
        the launch's whole group (collective: every rank calls it, with that group current)."""
        c10d = dist.distributed_c10d
        count = torch.tensor([c10d._world.group_count], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        c10d._world.group_count = int(count.item())

    def leave(self) -> None:
        """The launch is over: every rank's default group is the launch's own again, as Ray
        Train's teardown expects (it destroys the default group on the ranks that have one)."""
        if self._groups:
            dist.distributed_c10d._update_default_pg(self._groups[self.launch_size])
            self.size = self.launch_size
