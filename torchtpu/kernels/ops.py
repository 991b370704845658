"""Torch ops that our own graphs contain: fused patterns the passes insert into ATen graphs (see
passes/pallas_rewrites.py), and the window the eager device's bucketed programs read a storage
through (device/bucketed.py).

They exist so such a node has a schema, a name in the cache key and a rule; they only run
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


@torch.library.custom_op("torchtpu::conv_bn", mutates_args=())
def conv_bn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, bn_weight: torch.Tensor | None,
            bn_bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor, eps: float, stride: list[int],
            padding: list[int], dilation: list[int], groups: int, relu: bool) -> torch.Tensor:
    """An eval-mode BatchNorm (running statistics) of a convolution, then optionally ReLU."""
    y = torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)
    y = torch.nn.functional.batch_norm(y, mean, var, bn_weight, bn_bias, False, 0.0, eps)
    return torch.relu(y) if relu else y


@conv_bn.register_fake
def _(x, w, b, bn_weight, bn_bias, mean, var, eps, stride, padding, dilation, groups, relu):
    return torch.ops.aten.convolution(x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)


@torch.library.custom_op("torchtpu::window", mutates_args=())
def window(x: torch.Tensor, dim: int, start: torch.Tensor, length: int) -> torch.Tensor:
    """`x.narrow(dim, start, length)` (a copy) where `start` is a 0-d int64 tensor: a position known
    only when the program runs (a view at a new offset of a padded storage: the newest token)."""
    return x.narrow(dim, int(start), length).clone()


@window.register_fake
def _(x, dim, start, length):
    shape = list(x.shape)
    shape[dim] = length
    return x.new_empty(shape)
