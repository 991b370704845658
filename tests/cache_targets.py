"""Prewarm targets (`module:function` returning (model, [input_tuple, ...])) for the cache tests."""
from __future__ import annotations

import torch

from benchmarks import models


def mlp_sets():
    torch.manual_seed(0)
    return models.MLP(), [(torch.randn(b, 32),) for b in (2, 3, 5)]


def llama():
    torch.manual_seed(0)
    return models.hf_llama(), [(torch.randint(0, 256, (2, 16)),)]


def transformer_block():
    torch.manual_seed(0)
    return models.Block(64, 4).eval(), [(torch.randn(2, 16, 64),), (torch.randn(1, 32, 64),)]


def cnn():
    """Its dense convolutions call ATen's kernel (a custom call) on the CPU."""
    torch.manual_seed(0)
    return models.CNN().eval(), [(torch.randn(2, 3, 16, 16),)]


def decoder_lengths():
    """A tiny decoder called with two sequence lengths: in one process the second call gets
    Dynamo's automatic-dynamic (symbolic-size) graph."""
    torch.manual_seed(0)
    model = models.TinyDecoder(vocab=64, dim=32, heads=2, layers=1, max_len=16).eval()
    return model, [(torch.randint(0, 64, (2, n)),) for n in (8, 12)]
