"""An EmbeddingBag click model with a `preprocess`: the kind of workload a user brings.

Copied by the tests into a temporary folder that is on no import path, next to byo.yaml, and
run from there: the driver must find it beside the sweep file, the workers through Ray's
runtime_env. `clicks` (a helper module beside the package) is imported at module level, so it
must travel with it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from clicks import click_rule
from torch import nn

from amdahl import Workload


class ClickModel(nn.Module):
    def __init__(self, items: int, dim: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(items, dim, mode="mean")
        self.out = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.bag(ids)).squeeze(-1)


class TinyRec(Workload):
    defaults = {
        "items": 500,
        "dim": 16,
        "history": 8,
        "train_rows": 4096,
        "val_rows": 512,
        # The multi-node test: a train worker must have imported this file from the copy
        # Ray's runtime_env unpacked, not from the folder the driver read it in.
        "require_shipped": False,
    }
    data_params = ("items", "history", "train_rows", "val_rows")

    def build_model(self) -> nn.Module:
        if self.params["require_shipped"] and "runtime_resources" not in Path(__file__).parts:
            raise RuntimeError(f"imported from {__file__}, not from Ray's runtime_env")
        return ClickModel(self.params["items"], self.params["dim"])

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        raw = rng.integers(0, 10 * self.params["items"], (num_rows, self.params["history"]))
        return {"raw_ids": raw.astype(np.int64), "clicked": click_rule(raw)}

    def preprocess(self, batch: dict[str, np.ndarray], training: bool) -> dict[str, np.ndarray]:
        """Hash raw item ids into the embedding table; labels as floats for the logit loss.
        (np.stack: Ray Data hands a 2-D column over as an array of rows.)"""
        ids = np.stack(batch["raw_ids"]) % self.params["items"]
        return {"ids": ids.astype(np.int64), "clicked": batch["clicked"].astype(np.float32)}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["ids"], batch["clicked"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(output, target)

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output > 0).float() == target).sum()
