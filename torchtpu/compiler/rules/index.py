"""Indexing ops: advanced indexing, gather/scatter and their reductions, masked scatter.

Indices wrap as torch's do (negative counts from the end). Scatters with duplicate
indices and no reduction leave one of the written values, as torch does; which one is
unspecified in both.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten


def _dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1)


def _wrap(index, size):
    """Negative indices count from the end, as torch's do."""
    index = index.astype(jnp.int64)
    return jnp.where(index < 0, index + size, index)


def _advanced(x, indices):
    """A numpy-style index tuple for torch's index list (None entries mean the whole dim).

    Boolean masks become integer coordinates (padded out of bounds, to be dropped by
    scatters) so their shapes stay static.
    """
    out, d = [], 0
    for index in indices:
        if index is None:
            out.append(slice(None))
            d += 1
        elif index.dtype == jnp.bool_:
            shape = x.shape[d:d + index.ndim]
            coords = jnp.nonzero(index, size=index.size, fill_value=tuple(shape) or None)
            out.extend(c.astype(jnp.int64) for c in coords)
            d += index.ndim
        else:
            out.append(_wrap(index, x.shape[d]))
            d += 1
    return tuple(out)


@op(aten.index.Tensor, aten.index.Tensor_hacked_twin, aten._unsafe_index.Tensor,
    aten._unsafe_index.Tensor_hacked_twin)
def _index(ctx, x, indices):
    if any(i is not None and i.dtype == jnp.bool_ for i in indices):
        raise NotImplementedError("indexing with a boolean mask has a data-dependent shape")
    return x[_advanced(x, indices)]


def _index_target_shape(x, idx):
    return jnp.zeros(x.shape, jnp.bool_)[idx].shape


@op(aten.index_put.default, aten.index_put.hacked_twin, aten._unsafe_index_put.default,
    aten._unsafe_index_put.hacked_twin, aten._index_put_impl.default)  # the last: indexing's backward
def _index_put(ctx, x, indices, values, accumulate=False, unsafe=False):
    idx = _advanced(x, indices)
    values = values.astype(x.dtype)
    target = _index_target_shape(x, idx)
    if values.shape != target and values.ndim and values.size != 1 and any(
            i is not None and i.dtype == jnp.bool_ for i in indices):
        # a mask's values hold one row per True element; pad them to the mask's static size
        values = _pad_to(values, target)
    values = jnp.broadcast_to(values, target)
    return _scatter_reduce(x, idx, values, "sum" if accumulate else None)


def _pad_to(values, target):
    lead = len(target) - values.ndim
    pads = [(0, 0)] * values.ndim
    for k in range(values.ndim):
        t = target[lead + k]
        if values.shape[k] not in (1, t):
            pads[k] = (0, t - values.shape[k])
    return jnp.pad(values, pads)


@op(aten.index_select.default)
def _index_select(ctx, x, dim, index):
    if x.ndim == 0:
        return x
    dim = _dim(dim, x.ndim)
    return jnp.take(x, _wrap(index.reshape(-1), x.shape[dim]), axis=dim, mode="clip")


def _grid(index, dim):
    """The full coordinates `index` names along `dim` (iota in every other dim)."""
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d)
                 for d in range(index.ndim))


def _as_1d(x):
    return x.reshape(1) if x.ndim == 0 else x


@op(aten.gather.default)
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    x1, index1 = _as_1d(x), _as_1d(index)
    dim = _dim(dim, x1.ndim)
    idx = _grid(_wrap(index1, x1.shape[dim]), dim)
    return x1[idx].reshape(index.shape)


_REDUCE_NAMES = {"add": "sum", "multiply": "prod"}


def _scatter_reduce(x, idx, src, reduce, include_self=True):
    """x with src scattered to idx and combined by `reduce` (None, sum, prod, mean, amax, amin)."""
    src = src.astype(x.dtype)
    at = x.at[idx]
    if reduce is None:
        return at.set(src, mode="drop")
    reduce = _REDUCE_NAMES.get(reduce, reduce)
    if x.dtype == jnp.bool_:  # torch's bool sum is OR and its product AND
        reduce = {"sum": "amax", "prod": "amin"}.get(reduce, reduce)
    if not include_self:
        identity = {"sum": 0, "mean": 0, "prod": 1}.get(reduce)
        if identity is None:
            identity = _lowest(x.dtype) if reduce == "amax" else _highest(x.dtype)
        x = at.set(jnp.asarray(identity, x.dtype), mode="drop")
        at = x.at[idx]
    if reduce in ("sum", "mean"):
        out = at.add(src, mode="drop")
        if reduce == "mean":
            count = jnp.zeros(x.shape, x.dtype).at[idx].add(jnp.ones_like(src), mode="drop")
            count = jnp.maximum(count + (1 if include_self else 0), 1)
            out = out / count if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.floor_divide(out, count)
        return out
    if reduce == "prod":
        return at.multiply(src, mode="drop")
    out = at.max(src, mode="drop") if reduce == "amax" else at.min(src, mode="drop")
    if jnp.issubdtype(x.dtype, jnp.floating):  # torch's max/min propagate NaN
        nan = jnp.zeros(x.shape, jnp.bool_).at[idx].max(jnp.isnan(src), mode="drop")
        out = jnp.where(nan | jnp.isnan(x), jnp.nan, out)
    return out


def _lowest(dtype):
    if dtype == jnp.bool_:
        return False
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype):
    if dtype == jnp.bool_:
        return True
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


@op(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
    aten.scatter_add.default, aten.scatter_reduce.two)
def _scatter(ctx, x, dim, index, src, reduce=None, *, include_self=True):
    if ctx.node.target is aten.scatter_add.default:
        reduce = "sum"
    x1, index1 = _as_1d(x), _as_1d(index)
    dim = _dim(dim, x1.ndim)
    if isinstance(src, (bool, int, float)) or src.ndim == 0:
        src1 = jnp.broadcast_to(jnp.asarray(src, x.dtype), index1.shape)
    else:
        src1 = _as_1d(src)[tuple(slice(0, n) for n in index1.shape)]
    idx = _grid(_wrap(index1, x1.shape[dim]), dim)
    return _scatter_reduce(x1, idx, src1, reduce, include_self).reshape(x.shape)


@op(aten.index_reduce.default)
def _index_reduce(ctx, x, dim, index, source, reduce, *, include_self=True):
    x1, source1 = _as_1d(x), _as_1d(source)
    dim = _dim(dim, x1.ndim)
    idx = (slice(None),) * dim + (_wrap(index.reshape(-1), x1.shape[dim]),)
    return _scatter_reduce(x1, idx, source1, reduce, include_self).reshape(x.shape)


@op(aten.take.default)
def _take(ctx, x, index):
    # (torch's core decomposition of take runs first; this rule serves graphs without it)
    return jnp.take(x.reshape(-1), _wrap(index, x.size), mode="clip")


@op(aten.masked_scatter.default)
def _masked_scatter(ctx, x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    flat = mask.reshape(-1)
    pos = jnp.cumsum(flat.astype(jnp.int64)) - 1
    source = source.reshape(-1).astype(x.dtype)
    picked = jnp.take(source, jnp.clip(pos, 0, max(source.size - 1, 0)), mode="clip") if source.size \
        else jnp.zeros(flat.shape, x.dtype)
    return jnp.where(flat, picked, x.reshape(-1)).reshape(shape)


@op(aten.put.default)
def _put(ctx, x, index, source, accumulate=False):
    flat = x.reshape(-1)
    idx = index.reshape(-1)
    idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
    src = source.reshape(-1).astype(x.dtype)
    out = flat.at[idx].add(src) if accumulate else flat.at[idx].set(src)
    return out.reshape(x.shape)


@op(aten.nonzero_static.default)
def _nonzero_static(ctx, x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int64)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=-1).astype(jnp.int64) if coords else jnp.zeros((size, 0), jnp.int64)
