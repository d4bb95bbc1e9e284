"""A workload that fails on one rank only: the fault that strands the other ranks in DDP's
all-reduce (imported by name in Ray workers, which share the test driver's sys.path)."""

import os
from pathlib import Path

import torch.distributed as dist
from torch import nn

from workloads.mlp import MLP
from workloads.simulated import SimulatedAccelerator


class OneRankFails(MLP):
    """Raises in rank 1's fifth forward pass; rank 0 trains on into the step's all-reduce."""

    def build_model(self) -> nn.Module:
        model = super().build_model()
        calls = [0]

        def fail_on_rank_1(module: nn.Module, inputs: tuple) -> None:
            calls[0] += 1
            if dist.get_rank() == 1 and calls[0] == 5:
                raise RuntimeError("injected failure on rank 1 only")

        model.register_forward_pre_hook(fail_on_rank_1)
        return model


class PoisonsOnce(MLP):
    """The first forward pass in a Ray worker raises the text of a sticky CUDA error (simulated
    on CPU: the harness classifies by the error, not the device); `poison_marker` names the file
    that says it already happened, so the relaunched worker group trains normally. The driver's
    memory probe runs the model too, and is left alone: the poison is a trial's."""

    defaults = {**MLP.defaults, "poison_marker": ""}
    data_params = tuple(MLP.defaults)

    def build_model(self) -> nn.Module:
        model = super().build_model()
        marker = Path(self.params["poison_marker"])

        def poison_once(module: nn.Module, inputs: tuple) -> None:
            if _in_ray_worker() and not marker.exists():
                marker.touch()
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        model.register_forward_pre_hook(poison_once)
        return model


def _in_ray_worker() -> bool:
    import ray

    return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE


class KillsItsWorker(MLP):
    """With `kill` set, building the model ends the worker process at once (as a segfault or
    the OOM killer would): Ray Train restarts the worker group, which gets the item again.
    Only in a Ray worker: the driver's memory probe builds the model too."""

    defaults = {**MLP.defaults, "kill": False}
    data_params = tuple(MLP.defaults)

    def build_model(self) -> nn.Module:
        if self.params["kill"] and _in_ray_worker():
            os._exit(1)
        return super().build_model()


class SimulatedRankDies(SimulatedAccelerator):
    """The simulated accelerator whose rank `kill_rank` ends its worker process while building
    the model (as a segfault or the OOM killer would), on every delivery of the trial."""

    defaults = {**SimulatedAccelerator.defaults, "kill_rank": None}

    def build_model(self) -> nn.Module:
        kill = self.params["kill_rank"]  # the driver builds it too (for gradient bytes): no rank
        if kill is not None and dist.is_initialized() and dist.get_rank() == kill:
            os._exit(1)
        return super().build_model()


class KillsItsContinuation(MLP):
    """Ends its worker process (as the OOM killer would) in its `kill_at`-th forward pass, once
    per `kill_marker` file: with a halving rung of fewer steps before it, inside the next rung's
    continuation of a kept trial. Only in a Ray worker (not the driver's memory probe)."""

    defaults = {**MLP.defaults, "kill_at": 0, "kill_marker": ""}
    data_params = tuple(MLP.defaults)

    def build_model(self) -> nn.Module:
        model = super().build_model()
        marker, calls = Path(self.params["kill_marker"]), [0]

        def kill_once(module: nn.Module, inputs: tuple) -> None:
            calls[0] += 1
            if calls[0] == self.params["kill_at"] and _in_ray_worker() and not marker.exists():
                marker.touch()
                os._exit(1)

        model.register_forward_pre_hook(kill_once)
        return model
