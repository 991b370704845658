"""FFTs: aten._fft_r2c / _fft_c2r / _fft_c2c with torch's normalization codes.

torch's `normalization` is applied whatever the direction: 0 = none, 1 = 1/sqrt(n),
2 = 1/n, n being the product of the signal sizes over `dim`.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten


def _scale(x, sizes, normalization):
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return x
    factor = 1.0 / (math.sqrt(n) if normalization == 1 else n)
    return x * jnp.asarray(factor, x.real.dtype)


def _complex_dtype(ctx):
    return ctx.out_dtype


@op(aten._fft_r2c.default)
def _fft_r2c(ctx, x, dim, normalization, onesided):
    dim = [d % x.ndim for d in dim]
    x = x.astype(jnp.float64 if ctx.out_dtype == jnp.complex128 else jnp.float32)
    if onesided:
        out = jnp.fft.rfftn(x, axes=dim, norm="backward")
    else:
        out = jnp.fft.fftn(x, axes=dim, norm="backward")
    return _scale(out, [x.shape[d] for d in dim], normalization)


@op(aten._fft_c2c.default)
def _fft_c2c(ctx, x, dim, normalization, forward):
    dim = [d % x.ndim for d in dim]
    x = x.astype(ctx.out_dtype)
    if not dim:
        return x
    if forward:
        out = jnp.fft.fftn(x, axes=dim, norm="backward")
    else:
        out = jnp.fft.ifftn(x, axes=dim, norm="forward")  # unnormalized inverse
    return _scale(out, [x.shape[d] for d in dim], normalization)


@op(aten._fft_c2r.default)
def _fft_c2r(ctx, x, dim, normalization, last_dim_size):
    dim = [d % x.ndim for d in dim]
    x = x.astype(jnp.complex128 if ctx.out_dtype == jnp.float64 else jnp.complex64)
    sizes = [x.shape[d] for d in dim[:-1]] + [int(last_dim_size)]
    out = jnp.fft.irfftn(x, s=sizes, axes=dim, norm="forward")  # unnormalized inverse
    return _scale(out, sizes, normalization)
