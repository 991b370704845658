"""Tensor creation: full, empty, arange, scalar_tensor, fill."""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten


@op(aten.full.default)
def _full(ctx, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, ctx.out_dtype)


@op(aten.full_like.default)
def _full_like(ctx, x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    return jnp.full(x.shape, fill_value, ctx.out_dtype)


@op(aten.scalar_tensor.default)
def _scalar_tensor(ctx, value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, ctx.out_dtype)


# Uninitialised memory in torch; zeros here (deterministic, and any value is correct).
@op(aten.empty.memory_format)
def _empty(ctx, size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), ctx.out_dtype)


@op(aten.empty_strided.default)
def _empty_strided(ctx, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), ctx.out_dtype)


@op(aten.empty_like.default)
def _empty_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, ctx.out_dtype)


# torch's zero tensor (sgn's and other backward formulas' gradient of zero): plain zeros here
@op(aten._efficientzerotensor.default)
def _efficientzerotensor(ctx, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), ctx.out_dtype)


@op(aten.zeros_like.default)
def _zeros_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, ctx.out_dtype)


@op(aten.ones_like.default)
def _ones_like(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, ctx.out_dtype)


@op(aten.fill.Scalar, aten.fill.Tensor)
def _fill(ctx, x, value):
    return jnp.broadcast_to(jnp.asarray(value).astype(x.dtype), x.shape)


@op(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    # torch computes arange as start + i * step in the result dtype (double for floats)
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = (list(args) + [1])[:3]
    size = ctx.val.shape[0]  # symbolic in dynamic graphs: its hint is not this program's size
    n = size if isinstance(size, int) else max(0, math.ceil((end - start) / step))
    out = ctx.out_dtype
    if jnp.issubdtype(out, jnp.floating):
        values = (start + jnp.arange(n, dtype=jnp.float64) * step).astype(out)
    else:
        values = (start + jnp.arange(n, dtype=jnp.int64) * step).astype(out)
    if ctx.platform in ("tpu", "portable"):  # XLA:TPU miscompiles slices of a concatenated iota (DECISIONS 94)
        values = lax.optimization_barrier(values)
    return values


@op(aten.empty_permuted.default)
def _empty_permuted(ctx, size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), ctx.out_dtype)
