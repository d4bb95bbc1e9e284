"""Workloads the report's Ray Train script must run through their own methods (imported by
name in Ray workers, which get this folder on their import path: conftest.py). Each forward
leaves a mark in the file `params.marks` names, when it names one, so a test can count the
script's steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from amdahl import Workload
from workloads.mlp import MLP


def _mark(marks: str) -> None:
    if marks:
        with open(marks, "a") as f:
            f.write(".")


class CountedMLP(MLP):
    """The built-in MLP, its forwards counted."""

    defaults = {**MLP.defaults, "marks": ""}
    data_params = tuple(MLP.defaults)

    def forward(self, model: nn.Module, inputs: Any, targets: Any) -> tuple[Any, Any]:
        _mark(self.params["marks"])
        return super().forward(model, inputs, targets)


class _TinyLM(nn.Module):
    """nanoGPT's calling convention: `forward(idx, targets)` returns `(logits, loss)`."""

    def __init__(self, vocab: int, width: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, Any]:
        h = self.embed(idx)
        for block in self.blocks:
            h = h + block(h)
        logits = self.head(h)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


class NextToken(Workload):
    """Rows of `tokens` (no x or y), stored with ids beyond the vocabulary that `preprocess`
    folds in, a model that takes its targets and computes its loss, and blocks to checkpoint."""

    defaults = {"vocab": 32, "width": 16, "layers": 2, "seq": 8, "train_rows": 512}
    defaults |= {"val_rows": 64, "marks": ""}
    data_params = ("seq", "train_rows", "val_rows")

    def build_model(self) -> nn.Module:
        return _TinyLM(self.params["vocab"], self.params["width"], self.params["layers"])

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        return {"tokens": rng.integers(0, 1000, (num_rows, self.params["seq"] + 1))}

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        return {"tokens": batch["tokens"] % self.params["vocab"]}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["tokens"][:, :-1], batch["tokens"][:, 1:]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.flatten(0, 1), target.flatten())

    def forward(self, model: nn.Module, inputs: Any, targets: Any) -> tuple[Any, Any]:
        _mark(self.params["marks"])
        return model(inputs, targets)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(model.blocks)
