"""Sorting and selection: sort, topk, kthvalue, median, nanmedian, searchsorted, bucketize.

Every sort is stable, NaN sorts as the largest value (first when descending), and equal
elements keep their original order in both directions, as torch's stable sort does.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten


def _sort(x, dim, descending=False):
    """(values, int64 indices) of a stable sort of x along dim."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    keys = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    iota = lax.broadcasted_iota(jnp.int64, x.shape, dim)
    if descending:  # a stable ascending sort of the reversed row, reversed back
        keys, iota = jnp.flip(keys, dim), jnp.flip(iota, dim)
    values, indices = lax.sort((keys, iota), dimension=dim, is_stable=True, num_keys=1)
    if descending:
        values, indices = jnp.flip(values, dim), jnp.flip(indices, dim)
    return values.astype(x.dtype), indices


@op(aten.sort.default)
def _sort_default(ctx, x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@op(aten.sort.stable)
def _sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@op(aten.topk.default)
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    values, indices = _sort(x, dim, descending=largest)
    if x.ndim == 0:
        return values, indices
    dim = dim % x.ndim
    return lax.slice_in_dim(values, 0, k, axis=dim), lax.slice_in_dim(indices, 0, k, axis=dim)


def _pick(values, indices, position, dim, keepdim):
    """values/indices at `position` (an array broadcastable to the reduced shape) along dim."""
    position = jnp.expand_dims(position, dim)
    v = jnp.take_along_axis(values, position, axis=dim)
    i = jnp.take_along_axis(indices, position, axis=dim)
    return (v, i) if keepdim else (jnp.squeeze(v, dim), jnp.squeeze(i, dim))


@op(aten.kthvalue.default)
def _kthvalue(ctx, x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    values, indices = _sort(x, dim)
    position = jnp.full(values.shape[:dim] + values.shape[dim + 1:], k - 1, jnp.int64)
    return _pick(values, indices, position, dim, keepdim)


def _median(x, dim, keepdim, ignore_nan):
    """torch's lower median along dim: NaN wins unless ignore_nan (then NaNs are skipped)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    values, indices = _sort(x, dim)
    n = x.shape[dim]
    nans = jnp.sum(jnp.isnan(x), axis=dim) if jnp.issubdtype(x.dtype, jnp.floating) \
        else jnp.zeros(values.shape[:dim] + values.shape[dim + 1:], jnp.int64)
    if ignore_nan:
        position = jnp.maximum((n - nans - 1) // 2, 0)
    else:  # the first NaN (NaNs sort last) when there is one
        position = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _pick(values, indices, position.astype(jnp.int64), dim, keepdim)


@op(aten.median.dim)
def _median_dim(ctx, x, dim=-1, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=False)


@op(aten.nanmedian.dim)
def _nanmedian_dim(ctx, x, dim=-1, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=True)


@op(aten.median.default, aten.nanmedian.default)
def _median_all(ctx, x):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    ignore_nan = ctx.node.target is aten.nanmedian.default
    return _median(x.reshape(-1), 0, False, ignore_nan)[0]


def _search(sorted_sequence, values, right, sorter=None):
    """int64 insertion points of `values` in the rows of `sorted_sequence` (torch's rules)."""
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int64), axis=-1)
    side = "right" if right else "left"
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side).astype(jnp.int64)
    lead = seq.shape[:-1]
    rows = seq.reshape(-1, seq.shape[-1])
    vals = values.reshape(rows.shape[0], -1)
    out = jax.vmap(lambda r, v: jnp.searchsorted(r, v, side=side))(rows, vals)
    return out.reshape(lead + values.shape[-1:]).astype(jnp.int64)


@op(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(ctx, sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    x = jnp.asarray(x, sorted_sequence.dtype) if isinstance(x, (bool, int, float)) else x
    return _search(sorted_sequence, x, right, sorter)


@op(aten.bucketize.Tensor, aten.bucketize.Scalar)
def _bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    x = jnp.asarray(x, boundaries.dtype) if isinstance(x, (bool, int, float)) else x
    return _search(boundaries, x, right)


@op(aten.mode.default)
def _mode(ctx, x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among ties) and the last index where it occurs."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = dim % x.ndim
    xm = jnp.moveaxis(x, d, -1)
    counts = jnp.sum(xm[..., :, None] == xm[..., None, :], axis=-1)
    most = jnp.max(counts, axis=-1, keepdims=True)
    top = jnp.finfo(x.dtype).max if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).max \
        if jnp.issubdtype(x.dtype, jnp.integer) else True
    value = jnp.min(jnp.where(counts == most, xm, top), axis=-1)
    positions = jnp.arange(xm.shape[-1])
    index = jnp.max(jnp.where(xm == value[..., None], positions, -1), axis=-1).astype(jnp.int64)
    if keepdim:
        value, index = jnp.expand_dims(value, d), jnp.expand_dims(index, d)
    return value, index
