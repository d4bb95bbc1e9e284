"""The multilayer perceptron of D2L section 12.1 (Linear 512-256-128-2 with ReLU).

Data: Gaussian inputs labelled by a fixed random "teacher" MLP, so the task is learnable and the
validation accuracy says whether a configuration still trains correctly.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from amdahl import Workload


class MLP(Workload):
    defaults = {
        "inputs": 512,
        "hidden": [256, 128],
        "classes": 2,
        "train_rows": 16384,
        "val_rows": 2048,
    }

    def _sizes(self) -> list[int]:
        return [self.params["inputs"], *self.params["hidden"], self.params["classes"]]

    def build_model(self) -> nn.Module:
        sizes = self._sizes()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        sizes = self._sizes()
        teacher = np.random.default_rng(seed)  # same teacher for train and val
        w1 = teacher.standard_normal((sizes[0], 64)).astype(np.float32)
        w2 = teacher.standard_normal((64, sizes[-1])).astype(np.float32)
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        x = rng.standard_normal((num_rows, sizes[0]), dtype=np.float32)
        y = (np.maximum(x @ w1, 0) @ w2).argmax(axis=1).astype(np.int64)
        return {"x": x, "y": y}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["x"], batch["y"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)

    def flops_per_sample(self) -> float:
        """What one training step's matmuls execute, 2 FLOPs per multiply-accumulate: the
        forward, every layer's weight gradient, and every layer's input gradient but the
        first's (the inputs need none, so autograd never computes it: 80% of the D2L MLP's
        MACs sit in that layer). A cross-check of the counted figure (worker/flops.py)."""
        sizes = self._sizes()
        macs = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        return 6.0 * macs - 2.0 * sizes[0] * sizes[1]
