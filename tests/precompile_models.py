"""Models the precompile tests save in one process and load in another (same weights in both)."""
from __future__ import annotations

import torch


def llama():
    """A 2-layer Hugging Face Llama with fixed random weights."""
    from benchmarks import models

    torch.manual_seed(0)
    return models.hf_llama()


def loss_fn(model, ids):
    return model(input_ids=ids).logits.float().pow(2).mean()


class MLP(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = torch.nn.Linear(8, hidden), torch.nn.Linear(hidden, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Scaled(MLP):
    """An MLP whose output scale is a plain Python setting (as a model config's values are)."""

    def __init__(self, scale=2.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale
