"""A simulated accelerator: a what-if and scale-testing workload, not a hardware benchmark.

A GPU rank is, to its host, mostly idle while its kernels run; what the host does is
communication, input and orchestration. This workload keeps exactly that and replaces the
kernels with host sleeps of a stated length, so 8-16 ranks fit on a 2-core box and every part of
amdahl around the compute runs for real: each layer has real parameters (`params_per_layer`
float32 values) and real gradients, so DDP's buckets and hooks, gloo's all-reduces, every sync
strategy's bytes, per-trial worlds, stragglers and overlap analysis are what they would be.

Each of `layers` layers sleeps, per step and micro-batch,

    forward   forward_fixed_ms + forward_per_sample_us * rows        (milliseconds / microseconds)
    backward  backward_factor x the forward

times a precision factor (`bf16_factor`, `fp16_factor` for autocast or bf16 weights; 1 in
fp32), times `straggler_factor` on rank `straggler_rank` (every `straggler_every`-th pass only,
where that is above 1: a rank that stalls now and then), times a uniform jitter of +-`jitter`
per layer call and a lognormal one exp(`jitter_sigma` z), z ~ N(0, 1), drawn once per forward
pass so a whole step is slow or fast together (both seeded by `jitter_seed` and the rank), times
1 + `in_core_slowdown` x (ranks per node - 1): the slowdown of compute that shares a node's
memory bandwidth (ranks per node: the trial's world over the launch's nodes,
`_ranks_per_node`). Jitter, stragglers and the in-core slowdown are what separate a user's fit
sweep from their measured one; scale_check.py uses them for held-out sets. At the defaults
each is off. The numbers say what the simulated device would take; they are not measured.
`stated_memory_gb` states its memory, which the plan's memory check holds trials to (the
tensors are real and small: set it low to see refusals at 8-16 ranks). `stated_tflops` states
the simulated device's fp32 peak (`peak_flops`: divided by a
precision's factor for that precision): the workload's FLOPs per sample are what that peak
would execute in the per-sample sleeps, so MFU reads as the per-sample share of the step spent
in the simulated kernels.

Only eager execution: a sleep is not a kernel that TorchScript or torch.compile can take (the
planner refuses the other values with this reason). The task (a linear teacher's labels) is
learnable, so validation loss and accuracy still say the training is correct.
"""

from __future__ import annotations

import math
import os
import random
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from amdahl import UserError, Workload


class _SleepLayer(torch.autograd.Function):
    """y = x * (1 + mean(w)), with the forward's and the backward's sleeps. The parameter's
    gradient is real (d loss / d w_i = sum(grad_y * x) / n for every i), cheap beside the
    sleeps, and the same on every rank only where the data are."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, forward_s: float, backward_s: float):
        time.sleep(forward_s)
        scale = 1.0 + w.float().mean()
        ctx.save_for_backward(x, w)
        ctx.backward_s = backward_s
        return x * scale.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        time.sleep(ctx.backward_s)
        x, w = ctx.saved_tensors
        scale = 1.0 + w.float().mean()
        grad_x = grad_y * scale.to(grad_y.dtype)
        grad_w = (grad_y.float() * x.float()).sum() / w.numel()
        return grad_x, grad_w.to(w.dtype).expand(w.shape).contiguous(), None, None


class SimulatedLayer(nn.Module):
    """One layer of the simulated device: `size` real parameters, a stated time."""

    def __init__(self, size: int, timing: SimulatedTiming, first: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.timing = timing
        self.first = first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            self.timing.next_pass()
        forward_s, backward_s = self.timing.seconds(x, self.weight)
        return _SleepLayer.apply(x, self.weight, forward_s, backward_s)


class SimulatedTiming:
    """The stated times of one layer, and the factors that apply to this call."""

    def __init__(self, params: dict[str, Any]):
        self.fixed_s = params["forward_fixed_ms"] / 1e3
        self.per_sample_s = params["forward_per_sample_us"] / 1e6
        self.backward_factor = params["backward_factor"]
        self.factors = {torch.bfloat16: params["bf16_factor"], torch.float16: params["fp16_factor"]}
        self.straggler_rank = params["straggler_rank"]
        self.straggler_factor = params["straggler_factor"]
        self.straggler_every = params["straggler_every"]
        self.jitter = params["jitter"]
        self.jitter_sigma = params["jitter_sigma"]
        self.jitter_seed = params["jitter_seed"]
        self.in_core_slowdown = params["in_core_slowdown"]
        self._rng: random.Random | None = None
        self._pass_rng: random.Random | None = None
        self._pass = 0
        self._pass_factor = 1.0

    def next_pass(self) -> None:
        """A forward pass begins (the first layer's call): draw its lognormal jitter, so every
        layer of one step shares it as a slow or fast step on a real device does."""
        self._pass += 1
        if self.jitter_sigma:
            if self._pass_rng is None:
                self._pass_rng = random.Random(f"{self.jitter_seed}:{_rank()}:pass")
            self._pass_factor = math.exp(self.jitter_sigma * self._pass_rng.gauss(0.0, 1.0))

    def seconds(self, x: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
        forward = (self.fixed_s + self.per_sample_s * x.shape[0]) * self._factor(x, w)
        return forward, forward * self.backward_factor

    def _factor(self, x: torch.Tensor, w: torch.Tensor) -> float:
        rank = _rank()
        dtype = w.dtype
        if torch.is_autocast_enabled(x.device.type):
            dtype = torch.get_autocast_dtype(x.device.type)
        factor = self.factors.get(dtype, 1.0) * self._pass_factor
        if self.straggler_rank is not None and rank == self.straggler_rank:
            if self._pass % self.straggler_every == 0:
                factor *= self.straggler_factor
        if self.jitter:
            if self._rng is None:
                seed = f"{self.jitter_seed}:{rank}" if self.jitter_seed else rank
                self._rng = random.Random(seed)
            factor *= 1.0 + self.jitter * self._rng.uniform(-1.0, 1.0)
        if self.in_core_slowdown:
            factor *= 1.0 + self.in_core_slowdown * (_ranks_per_node() - 1)
        return factor


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _ranks_per_node() -> int:
    """This trial's ranks on this node, the ones sharing its memory bandwidth: the trial's
    world (its default process group) over the launch's nodes. The launch's nodes are the
    launcher's WORLD_SIZE over LOCAL_WORLD_SIZE, where it sets them; one node otherwise.
    Not LOCAL_WORLD_SIZE itself: a launch holds as many workers as its widest trial
    (amdahl/worker/worlds.py), and the ranks a narrower trial leaves idle wait in a barrier
    that takes no bandwidth (counting them slowed a 1-device trial in a 4-worker launch as
    4 ranks would be)."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    local, launch = os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE")
    nodes = max(1, int(launch) // int(local)) if local and launch else 1
    return max(1, math.ceil(world / nodes))


class SimulatedAccelerator(Workload):
    defaults = {
        "layers": 8,
        "params_per_layer": 32768,
        "features": 16,
        "classes": 4,
        "forward_fixed_ms": 1.0,
        "forward_per_sample_us": 20.0,
        "backward_factor": 2.0,
        "bf16_factor": 0.5,
        "fp16_factor": 0.5,
        "straggler_rank": None,
        "straggler_factor": 1.0,
        "straggler_every": 1,
        "jitter": 0.0,
        "jitter_sigma": 0.0,
        "jitter_seed": 0,
        "in_core_slowdown": 0.0,
        "stated_tflops": 100.0,
        "stated_memory_gb": 80.0,
        "train_rows": 8192,
        "val_rows": 512,
    }
    #: The counter sees no kernels (sleeps): MFU uses the stated figure.
    flops_override = True
    #: The stored rows depend only on these; the timings are not data.
    data_params = ("features", "classes", "train_rows", "val_rows")
    #: A rank mostly sleeps: 8 of them and their input fit on 2 cores (`resources: auto`).
    host_cpus_per_device = 0.2
    #: Compilation values it cannot honour (the planner refuses them with the reason).
    eager_only = (
        "the simulated accelerator's layers are host sleeps, which neither TorchScript nor "
        "torch.compile can compile; sweep compile: [eager]"
    )

    def __init__(self, **params: Any):
        super().__init__(**params)
        positive = ("bf16_factor", "fp16_factor", "backward_factor", "stated_tflops")
        for name in (*positive, "stated_memory_gb"):
            if not self.params[name] > 0:
                raise UserError(f"params.{name}: must be > 0, got {self.params[name]!r}")
        non_negative = ("jitter", "jitter_sigma", "in_core_slowdown")
        for name in ("forward_fixed_ms", "forward_per_sample_us", *non_negative):
            if not self.params[name] >= 0:
                raise UserError(f"params.{name}: must be >= 0, got {self.params[name]!r}")
        every = self.params["straggler_every"]
        if not (isinstance(every, int) and every >= 1):
            raise UserError(f"params.straggler_every: must be an integer >= 1, got {every!r}")

    def build_model(self) -> nn.Module:
        p = self.params
        timing = SimulatedTiming(p)
        body = [
            SimulatedLayer(p["params_per_layer"], timing, first=i == 0) for i in range(p["layers"])
        ]
        return nn.Sequential(*body, nn.Linear(p["features"], p["classes"]))

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        features, classes = self.params["features"], self.params["classes"]
        teacher = np.random.default_rng(seed).standard_normal((features, classes))
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        x = rng.standard_normal((num_rows, features), dtype=np.float32)
        return {"x": x, "y": (x @ teacher).argmax(axis=1).astype(np.int64)}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["x"], batch["y"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)

    def peak_flops(self, precision: str) -> float:
        """The stated fp32 peak, divided by the precision's factor: a device whose bf16 layers
        take half the time has twice the bf16 peak, as real ones do, so MFU reads alike."""
        factor = {"bf16": "bf16_factor", "bf16_weights": "bf16_factor", "fp16": "fp16_factor"}
        name = factor.get(precision)
        return self.params["stated_tflops"] * 1e12 / (self.params[name] if name else 1.0)

    def device_memory_gb(self) -> float:
        """The simulated device's stated memory: the plan refuses trials predicted above it
        (their tensors are real: parameters, gradients, DDP's buckets, the activations)."""
        return self.params["stated_memory_gb"]

    def flops_per_sample(self) -> float:
        """What the stated peak would execute in one sample's share of the sleeps (forward and
        backward over every layer): MFU then reads as the simulated kernels' share of a step."""
        p = self.params
        per_sample_s = p["layers"] * p["forward_per_sample_us"] / 1e6 * (1 + p["backward_factor"])
        return p["stated_tflops"] * 1e12 * per_sample_s
