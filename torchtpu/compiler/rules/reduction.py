"""Reductions: sum/mean/prod/amax/amin/any/all/var, arg-reductions, cumulative ops, softmax."""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def axes(x, dim) -> tuple[int, ...] | None:
    """torch's dim argument (None, int, or list; [] means all) as JAX axes."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    return tuple(d % max(x.ndim, 1) for d in dims) if x.ndim else None


def accumulate_dtype(out_dtype):
    """Accumulate low-precision floats in float32, as torch does on CPU."""
    return jnp.float32 if out_dtype in _LOW_PRECISION else out_dtype


def per_channel(x, axis) -> bool:
    """Whether `axis` is every dim of x but dim 1: a per-channel sum over an image batch."""
    return x.ndim >= 3 and axis is not None and sorted(axis) == [0] + list(range(2, x.ndim))


INPUT_ORDER = "torchtpu_input_order"  # a placeholder's layout when not row-major (lower.py, BoundaryLayouts)


def from_convolution(node, ctx, hops: int = 8) -> bool:
    """Whether an FX value is the result of one of ATen's channels-last convolutions, or the
    input gradient of one, reached through pointwise ops only (a bias, a normalisation's affine,
    an activation or its gradient): such an array is channels-minor in memory on the CPU."""
    from torchtpu.compiler.rules.conv import writes_channels_minor  # conv.py imports this module

    frontier, seen = [node], set()
    for _ in range(hops):
        ahead = []
        for n in frontier:
            if isinstance(n, torch.fx.Node) and n.op == "placeholder":
                order = n.meta.get(INPUT_ORDER)  # a backward's saved activation, as the forward left it
                if order is not None and len(order) >= 3 and order[-1] == 1:
                    return True
            if not isinstance(n, torch.fx.Node) or n.op != "call_function" or n in seen:
                continue
            seen.add(n)
            t = n.target
            if t is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[1] == 0:
                if writes_channels_minor(n.args[0], ctx):
                    return True
            elif writes_channels_minor(n, ctx):
                return True
            elif (isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags) or (
                    t is aten._to_copy.default and set(n.kwargs) <= {"dtype"}):  # a bfloat16 graph's casts
                ahead.extend(a for a in n.args if isinstance(a, torch.fx.Node))
        frontier = ahead
    return False


def by_rows(x, axis, ctx, source) -> bool:
    """Whether `sum_` sums x by image rows: on the CPU, a per-channel sum of a float image
    batch that one of ATen's channels-last convolutions produced (`source`, its FX node)."""
    return (ctx is not None and ctx.platform == "cpu" and source is not None and per_channel(x, axis)
            and jnp.issubdtype(x.dtype, jnp.floating) and from_convolution(source, ctx))


def sum_(x, axis, keepdims=False, ctx=None, source=None):
    """jnp.sum, or where `by_rows`, a batch of products with ones, then a sum of the rows.

    XLA keeps a channels-last convolution's result channels-minor (NHWC in memory), and
    XLA:CPU's reduction kernels take row-major operands only, so a sum over N, H and W copied
    the batch into NCHW order first (a BatchNorm's statistics, their gradients, a bias
    gradient). As the right operand of products batched over N and every spatial dim but the
    last, contracted over the last, the batch is read in the order it already has. One
    product over all N*H*W rows would lose digits (one long accumulation); the per-row partial
    sums are summed as before, which keeps torch's accuracy (docs/DECISIONS.md 115)."""
    if not by_rows(x, axis, ctx, source):
        return jnp.sum(x, axis=axis, keepdims=keepdims)
    return _sum_by_rows(x, keepdims)


def _sum_by_rows(x, keepdims):
    """The per-channel sum of `sum_`'s docstring, by image rows (no check of where x came from)."""
    last = x.ndim - 1
    rows = (0,) + tuple(range(2, last))  # N and the spatial dims but the last
    ones = jnp.ones([x.shape[i] for i in rows] + [x.shape[last]], x.dtype)
    part = lax.dot_general(ones, x, (((len(rows),), (last,)), (tuple(range(len(rows))), rows)),
                           precision=lax.Precision.HIGHEST, preferred_element_type=x.dtype)
    out = jnp.sum(part, axis=tuple(range(len(rows))))  # [rows..., C] partial sums, row-major
    return out.reshape([1, -1] + [1] * (x.ndim - 2)) if keepdims else out


@op(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = accumulate_dtype(ctx.out_dtype)
    return sum_(x.astype(acc), axes(x, dim), keepdim, ctx, ctx.node.args[0])


@op(aten.mean.dim, aten.mean.default)
def _mean(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = accumulate_dtype(ctx.out_dtype)
    axis = axes(x, dim)
    if by_rows(x, axis, ctx, ctx.node.args[0]):
        return _sum_by_rows(x.astype(acc), keepdim) / (x.size // x.shape[1])
    return jnp.mean(x.astype(acc), axis=axis, keepdims=keepdim)


@op(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    acc = accumulate_dtype(ctx.out_dtype)
    return jnp.prod(x.astype(acc), axis=axes(x, dim), keepdims=keepdim)


def _nan_propagating(reduce):
    """max/min that return NaN when any reduced element is NaN (torch semantics)."""

    def fn(x, axis, keepdims):
        out = reduce(x, axis=axis, keepdims=keepdims)
        if jnp.issubdtype(x.dtype, jnp.floating):
            out = jnp.where(jnp.any(jnp.isnan(x), axis=axis, keepdims=keepdims), jnp.nan, out)
        return out

    return fn


_max = _nan_propagating(jnp.max)
_min = _nan_propagating(jnp.min)


@op(aten.amax.default)
def _amax(ctx, x, dim=(), keepdim=False):
    return _max(x, axes(x, dim), keepdim)


@op(aten.amin.default)
def _amin(ctx, x, dim=(), keepdim=False):
    return _min(x, axes(x, dim), keepdim)


@op(aten.max.default)
def _max_all(ctx, x):
    return _max(x, None, False)


@op(aten.min.default)
def _min_all(ctx, x):
    return _min(x, None, False)


def _arg(x, dim, keepdim, fn):
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    if dim is None:
        out = fn(x.reshape(-1), axis=0)
        return out.reshape((1,) * x.ndim) if keepdim else out
    return fn(x, axis=dim % x.ndim, keepdims=keepdim)


@op(aten.argmax.default)
def _argmax(ctx, x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, jnp.argmax)


@op(aten.argmin.default)
def _argmin(ctx, x, dim=None, keepdim=False):
    return _arg(x, dim, keepdim, jnp.argmin)


@op(aten.max.dim)
def _max_dim(ctx, x, dim, keepdim=False):
    return _max(x, axes(x, dim), keepdim), _arg(x, dim, keepdim, jnp.argmax)


@op(aten.min.dim)
def _min_dim(ctx, x, dim, keepdim=False):
    return _min(x, axes(x, dim), keepdim), _arg(x, dim, keepdim, jnp.argmin)


@op(aten.any.default, aten.any.dim, aten.any.dims)
def _any(ctx, x, dim=None, keepdim=False):
    return jnp.any(x.astype(jnp.bool_), axis=axes(x, dim), keepdims=keepdim)


@op(aten.all.default, aten.all.dim, aten.all.dims)
def _all(ctx, x, dim=None, keepdim=False):
    return jnp.all(x.astype(jnp.bool_), axis=axes(x, dim), keepdims=keepdim)


@op(aten.var.correction, aten.var.dim)
def _var(ctx, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if ctx.node.target is aten.var.dim:
        correction = 1 if unbiased in (None, True) else 0
    correction = 1 if correction is None else correction
    acc = accumulate_dtype(ctx.out_dtype)
    return jnp.var(x.astype(acc), axis=axes(x, dim), ddof=correction, keepdims=keepdim)


@op(aten.var_mean.correction)
def _var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    correction = 1 if correction is None else correction
    acc = accumulate_dtype(ctx.out_dtype)
    x = x.astype(acc)
    ax = axes(x, dim)
    return jnp.var(x, axis=ax, ddof=correction, keepdims=keepdim), jnp.mean(x, axis=ax, keepdims=keepdim)


@op(aten.cumsum.default)
def _cumsum(ctx, x, dim, *, dtype=None):
    acc = accumulate_dtype(ctx.out_dtype)
    x = x.astype(acc)
    return x if x.ndim == 0 else jnp.cumsum(x, axis=dim % x.ndim)


@op(aten.cumprod.default)
def _cumprod(ctx, x, dim, *, dtype=None):
    acc = accumulate_dtype(ctx.out_dtype)
    x = x.astype(acc)
    return x if x.ndim == 0 else jnp.cumprod(x, axis=dim % x.ndim)


def _cum_extreme(x, dim, reduce):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = dim % x.ndim
    values = reduce(x, axis=dim)
    idx = lax.broadcasted_iota(jnp.int64, x.shape, dim)
    # index of the last position where the running extreme was reached
    hit = (x == values) | (jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.floating) else False)
    indices = lax.cummax(jnp.where(hit, idx, 0), axis=dim)
    return values, indices


def _nan_sticky(running):
    """A running max/min after which NaN stays once seen, as in torch."""
    def reduce(v, axis):
        if jnp.issubdtype(v.dtype, jnp.floating):
            nan_seen = lax.cummax(jnp.isnan(v).astype(jnp.int8), axis=axis) > 0
            return jnp.where(nan_seen, jnp.nan, running(v, axis=axis))
        return running(v, axis=axis)
    return reduce


@op(aten.cummax.default)
def _cummax(ctx, x, dim):
    return _cum_extreme(x, dim, _nan_sticky(lax.cummax))


@op(aten.cummin.default)
def _cummin(ctx, x, dim):
    return _cum_extreme(x, dim, _nan_sticky(lax.cummin))


@op(aten.logsumexp.default)
def _logsumexp(ctx, x, dim=(), keepdim=False):
    acc = accumulate_dtype(ctx.out_dtype)
    return jax.nn.logsumexp(x.astype(acc), axis=axes(x, dim), keepdims=keepdim)


@op(aten._softmax.default)
def _softmax(ctx, x, dim, half_to_float=False):
    acc = accumulate_dtype(x.dtype)
    return jax.nn.softmax(x.astype(acc), axis=dim % max(x.ndim, 1)) if x.ndim else jnp.ones_like(x)


@op(aten._log_softmax.default)
def _log_softmax(ctx, x, dim, half_to_float=False):
    acc = accumulate_dtype(x.dtype)
    return jax.nn.log_softmax(x.astype(acc), axis=dim % max(x.ndim, 1)) if x.ndim else jnp.zeros_like(x)


@op(aten._softmax_backward_data.default)
def _softmax_backward(ctx, grad, out, dim, input_dtype):
    acc = accumulate_dtype(grad.dtype)
    grad, out = grad.astype(acc), out.astype(acc)
    return out * (grad - jnp.sum(grad * out, axis=dim, keepdims=True))


@op(aten._log_softmax_backward_data.default)
def _log_softmax_backward(ctx, grad, out, dim, input_dtype):
    acc = accumulate_dtype(grad.dtype)
    grad, out = grad.astype(acc), out.astype(acc)
    return grad - jnp.exp(out) * jnp.sum(grad, axis=dim, keepdims=True)


@op(aten.logcumsumexp.default, aten._logcumsumexp.default)
def _logcumsumexp(ctx, x, dim):
    acc = accumulate_dtype(ctx.out_dtype)
    x = x.astype(acc)
    return x if x.ndim == 0 else lax.cumlogsumexp(x, axis=dim % x.ndim)


@op(aten.histc.default)
def _histc(ctx, x, bins=100, min=0, max=0):
    x = x.reshape(-1).astype(accumulate_dtype(ctx.out_dtype))
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    if min == max:  # torch: use the data's range (widened by one when it is a single value)
        lo, hi = (jnp.min(x), jnp.max(x)) if x.size else (lo, hi)
        lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    index = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int64)
    index = jnp.clip(index, 0, bins - 1)
    return jnp.zeros((bins,), x.dtype).at[index].add(inside.astype(x.dtype))

