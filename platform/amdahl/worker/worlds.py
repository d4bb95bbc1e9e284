"""Per-trial process groups: one worker group runs the trials of several device counts.

Starting a Ray Train worker group costs seconds (new processes for the Tune trainable, the Train
controller and every worker, then the process group), and a sweep over devices 1-2-4 paid it once
per device count. On a single node a launch now holds as many workers as its largest trial, and a
trial on d devices runs on ranks 0..d-1 with a default process group of exactly those d ranks,
rebuilt whenever the size changes through the launch's own rendezvous store. The sync strategies
(DDP, ZeRO, FSDP2, PowerSGD, local SGD) keep using the default group, unchanged, so a d-device
trial runs as a d-worker launch would: the same ranks on the same node, the same backend, and no
collective ever reaches an idle rank. The other ranks skip the trial and wait in its report
barrier (Ray Train's, a blocking wait that takes no CPU from the measured ranks).

Every rank calls `enter` for every trial in the same order, so all agree on each group's name.
Each group times out as the launch says (`LaunchConfig.collective_timeout_s`, which the driver
sets by protocol.contract.collective_timeout_s).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


class TrialWorlds:
    """This rank's view of the launch's changing default process group."""

    def __init__(self, rank: int, size: int, timeout_s: int):
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self._rebuilds = 0
        self._backend = dist.get_backend() if dist.is_initialized() else None
        # Ray Train's rendezvous store; kept referenced so that it outlives the first group
        # (rank 0's copy serves it).
        self._store = dist.distributed_c10d._get_default_store() if self._backend else None

    def enter(self, size: int) -> bool:
        """Make the default group span ranks 0..size-1; returns whether this rank takes part.

        Collective in effect: every rank calls it with the same sizes in the same order, after
        the previous trial's report (so no rank is still inside the old group's collectives).
        """
        if size == self.size:
            return self.rank < size
        if self._store is None:
            raise RuntimeError(
                f"a trial on {size} devices in a launch of {self.size} workers needs the "
                "launch's process group, and there is none"
            )
        self._rebuilds += 1
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.rank < size:
            dist.init_process_group(
                self._backend,
                store=dist.PrefixStore(f"amdahl/world-{self._rebuilds}", self._store),
                rank=self.rank,
                world_size=size,
                timeout=timedelta(seconds=self.timeout_s),
            )
        self.size = size
        return self.rank < size
