"""Shape and layout ops: views, copies, concatenation, slicing, padding.

Views are values here: XLA programs have no aliasing, and AOTAutograd has already
rewritten the mutations and view relationships the user can observe.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import numpy as np
import torch

from torchtpu.compiler import dtypes
from torchtpu.compiler.registry import op
from torchtpu.kernels import ops as _ops  # noqa: F401  (defines torch.ops.torchtpu.window)

aten = torch.ops.aten


def norm_dim(dim: int, ndim: int) -> int:
    return dim % max(ndim, 1)


@op(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(ctx, x, size):
    return jnp.reshape(x, tuple(size))


@op(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, x, dims):
    return jnp.transpose(x, [norm_dim(d, x.ndim) for d in dims]) if x.ndim else x


@op(aten.t.default)
def _t(ctx, x):
    return x.T


@op(aten.transpose.int)
def _transpose(ctx, x, dim0, dim1):
    return jnp.swapaxes(x, norm_dim(dim0, x.ndim), norm_dim(dim1, x.ndim)) if x.ndim else x


@op(aten.expand.default, aten.expand_copy.default)
def _expand(ctx, x, size, *, implicit=False):
    size = list(size)
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, tuple(shape))


@op(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.squeeze_copy.dims)
def _squeeze(ctx, x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else ([dim] if isinstance(dim, int) else dim)
    dims = tuple(norm_dim(d, x.ndim) for d in dims if x.shape[norm_dim(d, x.ndim)] == 1)
    return jnp.squeeze(x, dims) if dims else x


@op(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(ctx, x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@op(aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default, aten.detach.default,
    aten.alias_copy.default, aten.contiguous.default)
def _identity(ctx, x, *, memory_format=None):
    return x


@op(aten._to_copy.default)
def _to_copy(ctx, x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    return dtypes.convert(x, ctx.out_dtype, ctx.platform)


@op(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    return jnp.broadcast_to(src.astype(dst.dtype), dst.shape)


@op(aten.cat.default)
def _cat(ctx, tensors, dim=0):
    out_dtype = ctx.out_dtype
    # torch skips legacy empty 1-d tensors of shape (0,) in cat
    parts = [t.astype(out_dtype) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return jnp.zeros((0,), out_dtype)
    return jnp.concatenate(parts, axis=norm_dim(dim, parts[0].ndim))


@op(torch.ops.torchtpu.window.default)
def _window(ctx, x, dim, start, length):
    """A slice at a run-time start: torch guarantees it lies inside the (true) dim, so XLA's clamp
    of the start never acts."""
    return lax.dynamic_slice_in_dim(x, start.astype(jnp.int64), length, axis=norm_dim(dim, x.ndim))


@op(aten.stack.default)
def _stack(ctx, tensors, dim=0):
    out_dtype = ctx.out_dtype
    return jnp.stack([t.astype(out_dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


def _slice_bounds(size, start, end, step):
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


@op(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.ndim)
    start, end, step = _slice_bounds(x.shape[dim], start, end, step)
    return lax.slice_in_dim(x, start, end, step, axis=dim)


@op(aten.slice_scatter.default)
def _slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    dim = norm_dim(dim, x.ndim)
    start, end, step = _slice_bounds(x.shape[dim], start, end, step)
    if step == 1:  # an in-place update XLA fuses; `.at[].set` becomes a serial scatter on the CPU
        return lax.dynamic_update_slice_in_dim(x, src.astype(x.dtype), start, axis=dim)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@op(aten.select.int, aten.select_copy.int)
def _select(ctx, x, dim, index):
    dim = norm_dim(dim, x.ndim)
    return lax.index_in_dim(x, index % x.shape[dim], axis=dim, keepdims=False)


@op(aten.select_scatter.default)
def _select_scatter(ctx, x, src, dim, index):
    dim = norm_dim(dim, x.ndim)
    return lax.dynamic_update_index_in_dim(x, src.astype(x.dtype), index % x.shape[dim], axis=dim)


@op(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(ctx, x, split_sizes, dim=0):
    dim = norm_dim(dim, x.ndim)
    offsets = np.cumsum([0] + list(split_sizes))
    return tuple(lax.slice_in_dim(x, int(a), int(b), axis=dim) for a, b in zip(offsets[:-1], offsets[1:]))


@op(aten.split.Tensor, aten.split_copy.Tensor)
def _split(ctx, x, split_size, dim=0):
    dim = norm_dim(dim, x.ndim)
    size = x.shape[dim]
    starts = list(range(0, size, split_size)) or [0]
    return tuple(lax.slice_in_dim(x, s, min(s + split_size, size), axis=dim) for s in starts)


@op(aten.unbind.int, aten.unbind_copy.int)
def _unbind(ctx, x, dim=0):
    dim = norm_dim(dim, x.ndim)
    return tuple(lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim]))


@op(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim))


@op(aten.flip.default)
def _flip(ctx, x, dims):
    return jnp.flip(x, [norm_dim(d, x.ndim) for d in dims]) if dims and x.ndim else x


@op(aten.repeat.default)
def _repeat(ctx, x, repeats):
    repeats = list(repeats)
    x = jnp.reshape(x, (1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, repeats)


@op(aten.constant_pad_nd.default)
def _constant_pad(ctx, x, pad, value=0):
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        config[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


@op(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(ctx, x, size, stride, storage_offset=None):
    # Gather from the flattened (contiguous) input: the functional meaning of as_strided
    # over a base tensor, which is what AOTAutograd passes here.
    flat = jnp.reshape(x, (-1,))
    index = _strided_index(size, stride, storage_offset)
    return flat[jnp.asarray(index)] if flat.shape[0] else jnp.zeros(tuple(size), x.dtype)


@op(aten.tril.default)
def _tril(ctx, x, diagonal=0):
    return jnp.tril(x, diagonal)


@op(aten.triu.default)
def _triu(ctx, x, diagonal=0):
    return jnp.triu(x, diagonal)


@op(aten.roll.default)
def _roll(ctx, x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(norm_dim(d, x.ndim) for d in dims))


@op(aten.diagonal_scatter.default)
def _diagonal_scatter(ctx, x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    n = src.shape[-1]
    i = jnp.arange(n)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@op(aten.as_strided_scatter.default)
def _as_strided_scatter(ctx, x, src, size, stride, storage_offset=None):
    flat = jnp.reshape(x, (-1,))
    index = _strided_index(size, stride, storage_offset)
    return flat.at[jnp.asarray(index).reshape(-1)].set(src.astype(x.dtype).reshape(-1)).reshape(x.shape)


def _strided_index(size, stride, storage_offset):
    index = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        index = index + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return index
