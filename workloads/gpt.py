"""A small decoder-only transformer language model (GPT-style, pre-norm, causal attention).

Where the MLP is all tiny matmuls, this is the workload on which precision, compilation and
sharding matter: attention, layer norms and a vocabulary projection. The data is synthetic but
learnable: token sequences drawn from a fixed random bigram table with a few strong transitions,
so the loss falls well below log(vocab) and validation accuracy (next-token) means something.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from amdahl import Workload


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        mask = torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class _GPT(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[_Block(width, heads, context) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        return self.head(self.norm(self.blocks(x)))


class GPT(Workload):
    defaults = {
        "vocab": 256,
        "width": 128,
        "layers": 2,
        "heads": 4,
        "context": 64,
        "train_rows": 4096,
        "val_rows": 512,
    }

    def build_model(self) -> nn.Module:
        p = self.params
        return _GPT(p["vocab"], p["width"], p["layers"], p["heads"], p["context"])

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(model.blocks)

    def generate(self, split: str, num_rows: int, seed: int) -> dict[str, np.ndarray]:
        vocab, context = self.params["vocab"], self.params["context"]
        table_rng = np.random.default_rng(seed)  # one language for train and val
        successors = table_rng.integers(0, vocab, size=(vocab, 4))
        rng = np.random.default_rng([seed, 0 if split == "train" else 1])
        tokens = np.empty((num_rows, context + 1), dtype=np.int64)
        tokens[:, 0] = rng.integers(0, vocab, size=num_rows)
        for t in range(1, context + 1):
            choice = rng.integers(0, 4, size=num_rows)
            noise = rng.random(num_rows) < 0.1
            nxt = successors[tokens[:, t - 1], choice]
            tokens[:, t] = np.where(noise, rng.integers(0, vocab, size=num_rows), nxt)
        return {"tokens": tokens}

    def split_batch(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = batch["tokens"]
        return tokens[:, :-1], tokens[:, 1:]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Per-sequence accuracy would be ~0; report next-token accuracy scaled to sequences,
        # so that correct / rows is the mean next-token accuracy.
        return (output.argmax(dim=-1) == target).float().mean(dim=1).sum()

    def flops_per_sample(self) -> float:
        """The model's training FLOPs per sequence (PaLM, appendix B; 2 per multiply-accumulate),
        a cross-check of the counted figure (worker/flops.py): 6 per token and weight of the
        layers' linear maps and the vocabulary head (the embeddings are lookups, not matmuls,
        unlike Kaplan's 6 x all parameters), plus attention, per layer and token 4 x context x
        width forward (scores, then values) and twice that backward: 12, PaLM's 12 x layers x
        width x context, over the full matrix as torch counts it, not the causal half. The fused
        kernels' recomputation of the scores (2 more) is hardware FLOPs, not the model's."""
        p = self.params
        w, n, t, v = p["width"], p["layers"], p["context"], p["vocab"]
        return 6.0 * (n * 12 * w * w + v * w) * t + 12.0 * n * w * t * t
