"""Torch ops for fused patterns the passes insert into ATen graphs (see passes/pallas_rewrites.py).

They exist so a fused node has a schema, a name in the cache key and a rule; they only run
eagerly in reproducers.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("torchtpu::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): rstd = rsqrt(mean(x^2, -1, keepdim) + eps); y = (x * rstd).to(weight.dtype) * weight."""
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = x * rstd
    return (y if weight is None else y.to(weight.dtype) * weight), rstd


@rms_norm.register_fake
def _(x, weight, eps):
    dtype = x.dtype if weight is None else weight.dtype
    return x.new_empty(x.shape, dtype=dtype), x.new_empty((*x.shape[:-1], 1))
