"""Pooling: max (with torch's flat indices), average and adaptive pools, and their backward ops.

Windows are static (they depend on shapes only), so every pool gathers its windows with
static index tables: each spatial axis of extent `in` becomes (out, K) — the K window
positions of each output — plus a validity mask for positions outside the input (padding,
or the ragged end of an adaptive bin). Backward ops are VJPs of the forward rules or, for
max pools, a scatter-add at the saved indices.
"""
from __future__ import annotations

import itertools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
import torch

from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.reduction import accumulate_dtype

aten = torch.ops.aten


def _expand(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(value) == 0:
        return None
    return [int(v) for v in (value * n if len(value) == 1 else value)]


def _out_spatial(ctx, nd):
    val = ctx.val
    if isinstance(val, (tuple, list)):
        val = val[0]
    return [int(s) for s in val.shape[-nd:]]


# --- window tables -------------------------------------------------------------------------


def _regular_axis(size, out, k, s, p, d):
    """Positions (out, k) of a strided/padded/dilated window along one axis."""
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _adaptive_axis(size, out):
    start = (np.arange(out) * size) // out
    end = -((-(np.arange(out) + 1) * size) // out)
    k = int(np.max(end - start))
    pos = start[:, None] + np.arange(k)[None, :]
    return pos, pos < end[:, None]


def _windows(x, axes_tables):
    """x (..., *spatial) -> values (..., *out, K), valid (*out, K), flat positions (*out, K).

    The kernel axis K runs over window offsets in row-major order (the first spatial axis
    outermost), which is the order torch's kernels visit them in.
    """
    nd = len(axes_tables)
    lead = x.ndim - nd
    sizes = x.shape[lead:]
    # Gather axis by axis: (..., S0, S1) -> (..., O0, K0, S1) -> (..., O0, K0, O1, K1).
    for i, (pos, _) in enumerate(axes_tables):
        axis = lead + 2 * i
        x = jnp.take(x, jnp.asarray(np.clip(pos, 0, sizes[i] - 1).reshape(-1)), axis=axis)
        x = x.reshape(x.shape[:axis] + pos.shape + x.shape[axis + 1:])
    # Move the K axes last: (..., O0, K0, O1, K1) -> (..., O0, O1, K0, K1).
    perm = list(range(lead)) + [lead + 2 * i for i in range(nd)] + [lead + 2 * i + 1 for i in range(nd)]
    x = jnp.transpose(x, perm)
    outs = [pos.shape[0] for pos, _ in axes_tables]
    ks = [pos.shape[1] for pos, _ in axes_tables]
    x = x.reshape(x.shape[:lead] + tuple(outs) + (math.prod(ks),))
    valid = np.ones(tuple(outs) + tuple(ks), bool)
    flat = np.zeros(tuple(outs) + tuple(ks), np.int64)
    plane_stride = [math.prod(sizes[i + 1:]) for i in range(nd)]
    for i, (pos, ok) in enumerate(axes_tables):
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = pos.shape
        # Tables are laid out (O0, K0)...; put them in (O0, O1, ..., K0, K1, ...) order.
        valid = valid & ok.reshape(shape)
        flat = flat + (pos * plane_stride[i]).reshape(shape)
    return x, valid.reshape(tuple(outs) + (-1,)), flat.reshape(tuple(outs) + (-1,))


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _max_with_indices(x, valid, flat):
    """torch's max-pool reduction over the last axis: the first maximum wins, a NaN wins over
    everything (the last NaN, as torch's `val > max || isnan(val)` scan leaves it)."""
    valid_j = jnp.asarray(valid)
    masked = jnp.where(valid_j, x, _lowest(x.dtype))
    m = jnp.max(masked, axis=-1)
    k = masked.shape[-1]
    first_max = jnp.argmax(valid_j & (masked == m[..., None]), axis=-1)
    if jnp.issubdtype(x.dtype, jnp.floating):
        nan = valid_j & jnp.isnan(masked)
        last_nan = k - 1 - jnp.argmax(jnp.flip(nan, axis=-1), axis=-1)
        choice = jnp.where(jnp.any(nan, axis=-1), last_nan, first_max)
    else:
        choice = first_max
    flat_j = jnp.broadcast_to(jnp.asarray(flat), masked.shape)
    idx = jnp.take_along_axis(flat_j, choice[..., None], axis=-1)[..., 0]
    return m, idx


def _window(nd, kernel, stride, padding, dilation):
    """torch's pool arguments as per-axis lists (an empty stride means the kernel's)."""
    kernel = _expand(kernel, nd)
    return kernel, _expand(stride, nd) or kernel, _expand(padding, nd), _expand(dilation, nd)


def _regular_tables(x, nd, out, kernel, stride, padding, dilation):
    """Per-axis window tables of a pool whose arguments `_window` expanded."""
    sizes = x.shape[-nd:]
    return [_regular_axis(sizes[i], out[i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(nd)]


# --- max pool -----------------------------------------------------------------------------


def _max_pool(ctx, x, nd, kernel, stride, padding, dilation):
    out = _out_spatial(ctx, nd)
    if not _indices_used(ctx.node) and jnp.issubdtype(x.dtype, jnp.floating):
        if ctx.platform == "cpu":
            return _max_values_cpu(x, nd, out, kernel, stride, padding, dilation), None
        return _max_values(x, nd, out, kernel, stride, padding, dilation), None
    kernel, stride, padding, dilation = _window(nd, kernel, stride, padding, dilation)
    tables = _regular_tables(x, nd, out, kernel, stride, padding, dilation)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return _max_with_indices_by_taps(x, tables, stride)
    values, valid, flat = _windows(x, tables)
    return _max_with_indices(values, valid, flat)


def _max_with_indices_by_taps(x, tables, stride):
    """torch's max pool with indices as its own scan over the window's taps, each tap one strided
    slice of the (-inf) padded input: an element replaces the running max when it is greater or
    NaN, and the index starts at the window's first element inside the input (torch's CPU kernel
    line for line). XLA fuses the taps into one loop; the gather of whole windows and the
    reductions over them that `_windows` and `_max_with_indices` build cost ResNet's 3x3/2 pool
    on [8, 32, 32, 32] about 10x as much (docs/DECISIONS.md 97)."""
    nd = len(tables)
    lead = x.ndim - nd
    sizes = x.shape[-nd:]
    low = [max(0, -int(pos.min())) for pos, _ in tables]
    high = [max(0, int(pos.max()) + 1 - n) for (pos, _), n in zip(tables, sizes)]
    xp = jnp.pad(x, [(0, 0)] * lead + list(zip(low, high)), constant_values=-jnp.inf)
    plane = np.cumprod((1,) + tuple(sizes[:0:-1]))[::-1]  # flat offset of one step along each axis

    def flat(cols):  # (*out,) flat positions of one tap column per axis
        return sum(np.reshape(c, [-1 if i == a else 1 for i in range(nd)]) * plane[a] for a, c in enumerate(cols))

    first = [pos[np.arange(len(pos)), np.argmax(ok, axis=1)] for pos, ok in tables]
    best = jnp.full(x.shape[:lead] + tuple(len(pos) for pos, _ in tables), -jnp.inf, x.dtype)
    index = jnp.broadcast_to(jnp.asarray(flat(first), jnp.int64), best.shape)
    for tap in itertools.product(*(range(pos.shape[1]) for pos, _ in tables)):
        start = [int(pos[0, t]) + lo for (pos, _), t, lo in zip(tables, tap, low)]
        limit = [b + s * (len(pos) - 1) + 1 for b, s, (pos, _) in zip(start, stride, tables)]
        piece = lax.slice(xp, [0] * lead + start, list(x.shape[:lead]) + limit, [1] * lead + stride)
        take = (piece > best) | jnp.isnan(piece)  # padding is -inf: never taken
        best = jnp.where(take, piece, best)
        index = jnp.where(take, jnp.asarray(flat([pos[:, t] for (pos, _), t in zip(tables, tap)]), jnp.int64), index)
    return best, index


def _indices_used(node) -> bool:
    """Whether anything reads a max pool's indices (inference graphs read only the values)."""
    return not all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _max_values(x, nd, out, kernel, stride, padding, dilation, dims=None, reducer=lax.max):
    """The values alone, as one reduce_window: padding (-inf) never wins a window that holds an
    input element. The gather form above costs twice as much on the CPU (docs/DECISIONS.md 41).
    `dims`: only these spatial dims (0-based among the last nd) are pooled, the others are left
    as they are."""
    kernel, stride, padding, dilation = _window(nd, kernel, stride, padding, dilation)
    # the high side pads up to the last window torch computes (ceil_mode may need more)
    high = [(o - 1) * s + d * (k - 1) + 1 - n - p
            for o, s, d, k, n, p in zip(out, stride, dilation, kernel, x.shape[-nd:], padding)]
    lead = x.ndim - nd
    pooled = range(nd) if dims is None else dims

    def only(seq):
        return tuple(v if i in pooled else 1 for i, v in enumerate(seq))

    return lax.reduce_window(x, _lowest(x.dtype), reducer, (1,) * lead + only(kernel), (1,) * lead + only(stride),
                             [(0, 0)] * lead + [(p, max(h, 0)) if i in pooled else (0, 0)
                                                for i, (p, h) in enumerate(zip(padding, high))],
                             window_dilation=(1,) * lead + only(dilation))


def _max_values_cpu(x, nd, out, kernel, stride, padding, dilation):
    """XLA:CPU's form: one reduce_window per spatial dim (the max over a window is the max of
    the maxima of its rows; torch keeps every window's rows partly inside the input), in float32
    for a narrower float (exact for a max), NaN propagated by the reducer itself (XLA:CPU's own
    max reduce_window lost a NaN in 2x2x2 windows). ResNet's 3x3/2 pool on [8, 32, 32, 32]:
    bfloat16 540-570 -> 190-220 µs, float32 ~165 -> ~135 µs (docs/DECISIONS.md 78)."""
    narrow = x.dtype in (jnp.bfloat16, jnp.float16)
    y = x.astype(jnp.float32) if narrow else x
    for d in range(nd):
        y = _max_values(y, nd, out, kernel, stride, padding, dilation, dims=(d,), reducer=_nan_max)
    return y.astype(x.dtype) if narrow else y


def _nan_max(a, b):
    """max with NaN winning, as torch's pooling: associative and commutative, so XLA may group
    a window's elements as it likes."""
    return jnp.where(jnp.isnan(a) | (a > b), a, b)


@op(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, x, 2, kernel_size, stride, padding, dilation)


@op(aten.max_pool3d_with_indices.default)
def _max_pool3d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, x, 3, kernel_size, stride, padding, dilation)


def _scatter_plane(grad, x, indices, nd):
    """grad (..., *out) added into zeros like x at the flat plane positions `indices`."""
    acc = accumulate_dtype(grad.dtype)
    lead = x.shape[:-nd]
    plane = math.prod(x.shape[-nd:])
    rows = math.prod(lead)
    g = grad.astype(acc).reshape(rows, -1)
    idx = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), acc).at[jnp.arange(rows)[:, None], idx].add(g)
    return out.reshape(x.shape)


@op(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(ctx, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_plane(grad, x, indices, 2)


@op(aten.max_pool3d_with_indices_backward.default)
def _max_pool3d_backward(ctx, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_plane(grad, x, indices, 3)


# --- adaptive max pool --------------------------------------------------------------------


def _adaptive_tables(x, nd, output_size):
    output_size = _expand(output_size, nd)
    sizes = x.shape[-nd:]
    return [_adaptive_axis(sizes[i], output_size[i] if output_size[i] is not None else sizes[i])
            for i in range(nd)]


def _adaptive_max(ctx, x, nd, output_size):
    values, valid, flat = _windows(x, _adaptive_tables(x, nd, output_size))
    return _max_with_indices(values, valid, flat)


@op(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(ctx, x, output_size):
    return _adaptive_max(ctx, x, 2, output_size)


@op(aten.adaptive_max_pool3d.default)
def _adaptive_max_pool3d(ctx, x, output_size):
    return _adaptive_max(ctx, x, 3, output_size)


@op(aten.adaptive_max_pool2d_backward.default)
def _adaptive_max_pool2d_backward(ctx, grad, x, indices):
    return _scatter_plane(grad, x, indices, 2)


@op(aten.adaptive_max_pool3d_backward.default)
def _adaptive_max_pool3d_backward(ctx, grad, x, indices):
    return _scatter_plane(grad, x, indices, 3)


# --- average pool -------------------------------------------------------------------------


def _avg_divisor(sizes, out, kernel, stride, padding, count_include_pad, divisor_override):
    """torch's per-output divisor (static): the window clipped to input+padding, or to the input."""
    nd = len(sizes)
    if divisor_override:
        return np.full(out, float(divisor_override))
    include, exclude = np.ones(out), np.ones(out)
    for i in range(nd):
        start = np.arange(out[i]) * stride[i] - padding[i]
        end = np.minimum(start + kernel[i], sizes[i] + padding[i])
        shape = [1] * nd
        shape[i] = out[i]
        include = include * (end - start).reshape(shape)
        exclude = exclude * (np.minimum(end, sizes[i]) - np.maximum(start, 0)).reshape(shape)
    return include if count_include_pad else exclude


def _avg_pool(x, nd, out, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    kernel = _expand(kernel, nd)
    stride = _expand(stride, nd) or kernel
    padding = _expand(padding, nd)
    acc = accumulate_dtype(x.dtype)
    tables = [_regular_axis(x.shape[-nd + i], out[i], kernel[i], stride[i], padding[i], 1) for i in range(nd)]
    values, valid, _ = _windows(x.astype(acc), tables)
    total = jnp.sum(jnp.where(jnp.asarray(valid), values, jnp.zeros((), acc)), axis=-1)
    divisor = _avg_divisor(x.shape[-nd:], out, kernel, stride, padding, count_include_pad, divisor_override)
    return total / jnp.asarray(divisor, acc)


@op(aten.avg_pool2d.default)
def _avg_pool2d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(x, 2, _out_spatial(ctx, 2), kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


@op(aten.avg_pool3d.default)
def _avg_pool3d(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    return _avg_pool(x, 3, _out_spatial(ctx, 3), kernel_size, stride, padding, ceil_mode,
                     count_include_pad, divisor_override)


def _avg_pool_backward(grad, x, nd, *params):
    acc = accumulate_dtype(grad.dtype)
    out = [int(s) for s in grad.shape[-nd:]]
    _, vjp = jax.vjp(lambda x_: _avg_pool(x_, nd, out, *params), jnp.zeros(x.shape, acc))
    return vjp(grad.astype(acc))[0]


@op(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(grad, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


@op(aten.avg_pool3d_backward.default)
def _avg_pool3d_backward(ctx, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    return _avg_pool_backward(grad, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


# --- adaptive average pool ----------------------------------------------------------------


def _adaptive_avg(x, nd, output_size):
    """Sums each bin's valid positions only (an inf elsewhere cannot leak into a bin)."""
    acc = accumulate_dtype(x.dtype)
    tables = _adaptive_tables(x, nd, output_size)
    if nd == 3 and acc != x.dtype:
        return _adaptive_avg3d_low_precision(x, tables)
    values, valid, _ = _windows(x.astype(acc), tables)
    total = jnp.sum(jnp.where(jnp.asarray(valid), values, jnp.zeros((), acc)), axis=-1)
    return total / jnp.asarray(valid.sum(axis=-1), acc)


def _adaptive_avg3d_low_precision(x, tables):
    """torch's CPU 3-d kernel sums in the input's own dtype (bf16/f16), in window order, then
    divides by kT, kH and kW in turn; rounding the same way keeps results equal."""
    values, valid, _ = _windows(x, tables)
    valid_j = jnp.asarray(valid)
    zero = jnp.zeros((), x.dtype)
    total = jnp.zeros(values.shape[:-1], x.dtype)
    if values.shape[-1] > 512:  # too long to unroll: accumulate in float32 instead
        total = jnp.sum(jnp.where(valid_j, values.astype(jnp.float32), 0), axis=-1)
    else:
        for k in range(values.shape[-1]):
            total = total + jnp.where(valid_j[..., k], values[..., k], zero)
    outs = [pos.shape[0] for pos, _ in tables]
    for i, (_, ok) in enumerate(tables):
        shape = [1] * 3
        shape[i] = outs[i]
        total = (total.astype(jnp.float32) / jnp.asarray(ok.sum(axis=1).reshape(shape), jnp.float32)).astype(x.dtype)
    return total


@op(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx, x, output_size):
    return _adaptive_avg(x, 2, output_size)


@op(aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool3d(ctx, x, output_size):
    return _adaptive_avg(x, 3, output_size)


def _adaptive_avg_backward(grad, x, nd):
    acc = accumulate_dtype(grad.dtype)
    out = [int(s) for s in grad.shape[-nd:]]
    _, vjp = jax.vjp(lambda x_: _adaptive_avg(x_, nd, out), jnp.zeros(x.shape, acc))
    return vjp(grad.astype(acc))[0]


@op(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(ctx, grad, x):
    return _adaptive_avg_backward(grad, x, 2)


@op(aten._adaptive_avg_pool3d_backward.default)
def _adaptive_avg_pool3d_backward(ctx, grad, x):
    return _adaptive_avg_backward(grad, x, 3)
