"""A small transformer encoder as a workload: the memory tests' model (tests/unit/worker and
tests/gpu), whose activations outweigh its weights as a language model's do."""

import numpy as np
import torch
from torch import nn

from amdahl import Workload

VOCAB, WIDTH, CONTEXT = 256, 64, 32


class TinyEncoder(Workload):
    """A two-layer transformer encoder over token ids: activations dominate its memory."""

    defaults = {"train_rows": 512, "val_rows": 64}

    def build_model(self) -> nn.Module:
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        return nn.Sequential(
            nn.Embedding(VOCAB, WIDTH), nn.TransformerEncoder(layer, 2), nn.Linear(WIDTH, VOCAB)
        )

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        x = rng.integers(0, VOCAB, (num_rows, CONTEXT), dtype=np.int64)
        return {"x": x, "y": np.roll(x, -1, axis=1)}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch["x"], batch["y"]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1))
