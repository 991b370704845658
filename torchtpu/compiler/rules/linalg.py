"""Matrix products. float32 precision follows torch.get_float32_matmul_precision()."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler import dtypes
from torchtpu.compiler.context import PROMOTE, as_dtype
from torchtpu.compiler.rules.reduction import accumulate_dtype
from torchtpu.compiler.registry import op

aten = torch.ops.aten

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}


def precision():
    """torch's float32 matmul precision as XLA's: "highest" keeps full float32 on TPU too."""
    return _PRECISION.get(torch.get_float32_matmul_precision(), lax.Precision.HIGHEST)


def matmul(a, b, out_dtype, ctx=None, first: int = 0):
    """a @ b with torch's accumulation. With `ctx`, an operand that is a transpose of its last two
    dims (aten.t, transpose, permute; node arguments `first` and `first + 1`) enters the dot in
    its source layout, the transpose folded into the dimension numbers: XLA:CPU turns a bfloat16
    dot whose operand is a transpose into a float32 one (both operands converted), 2.5-3.5x
    slower than its bfloat16 kernel, and a linear layer's weight always arrives as aten.t(w)."""
    acc = accumulate_dtype(out_dtype)
    if jnp.issubdtype(out_dtype, jnp.integer) or out_dtype == jnp.bool_:
        return jnp.matmul(a.astype(out_dtype), b.astype(out_dtype))
    if ctx is None or ctx.env is None or a.ndim != b.ndim or a.ndim not in (2, 3):
        return jnp.matmul(a, b, precision=precision(), preferred_element_type=acc)
    (a, ta), (b, tb) = _untransposed(ctx, first, a), _untransposed(ctx, first + 1, b)
    r = a.ndim
    batch = tuple(range(r - 2))
    dims = (((r - 2 if ta else r - 1,), (r - 1 if tb else r - 2,)), (batch, batch))
    return lax.dot_general(a, b, dims, precision=precision(), preferred_element_type=acc)


_TRANSPOSES = (aten.t.default, aten.transpose.int, aten.permute.default)


def _untransposed(ctx, index: int, value):
    """(source, True) when node argument `index` is a swap of the last two dims of `source`
    and reached the rule unchanged (bucket padding may mask an operand: then it stays)."""
    arg = ctx.node.args[index] if index < len(ctx.node.args) else None
    if not (isinstance(arg, torch.fx.Node) and arg.target in _TRANSPOSES and ctx.env.get(arg) is value):
        return value, False
    source = ctx.env.get(arg.args[0])
    if not hasattr(source, "ndim") or source.ndim != value.ndim:
        return value, False
    r = source.ndim
    if arg.target is aten.transpose.int:
        swapped = sorted(d % r for d in arg.args[1:3]) == [r - 2, r - 1]
    elif arg.target is aten.permute.default:
        swapped = [d % r for d in arg.args[1]] == [*range(r - 2), r - 1, r - 2]
    else:
        swapped = r == 2
    return (source, True) if swapped else (value, False)


@op(aten.mm.default, aten.bmm.default)
def _mm(ctx, a, b):
    return matmul(a, b, ctx.out_dtype, ctx)


@op(aten.matmul.default)
def _matmul(ctx, a, b):
    return matmul(a, b, ctx.out_dtype)


@op(aten.dot.default, aten.vdot.default)
def _dot(ctx, a, b):
    return matmul(a, b, ctx.out_dtype)


@op(aten.mv.default)
def _mv(ctx, a, b):
    return matmul(a, b, ctx.out_dtype)


def _scaled_add(ctx, bias, product, beta, alpha):
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    bias = bias.astype(product.dtype)
    return product + (bias if beta == 1 else bias * beta)


@op(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def _addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _scaled_add(ctx, bias, matmul(a, b, ctx.out_dtype, ctx, first=1), beta, alpha)


@op(aten.addbmm.default)
def _addbmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _scaled_add(ctx, bias, jnp.sum(matmul(a, b, ctx.out_dtype), axis=0), beta, alpha)


# --- norms and distances ------------------------------------------------------------------


def _norm_compute_dtype(x, dtype=None):
    """torch's vector_norm computes in float32 for low-precision floats, in x's dtype otherwise."""
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    if x.dtype in (jnp.bfloat16, jnp.float16):
        x = x.astype(jnp.float32)
    elif not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    return x


def vector_norm(x, ord, axis, keepdims):
    """sum(|x|^ord)^(1/ord) with torch's special cases (0: count, +-inf: max/min of |x|)."""
    ax = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(ax, axis=axis, keepdims=keepdims)
    if ord == float("-inf"):
        return jnp.min(ax, axis=axis, keepdims=keepdims)
    if ord == 0:
        return jnp.sum((ax != 0).astype(ax.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return jnp.sum(ax, axis=axis, keepdims=keepdims)
    if ord == 2:
        return jnp.sqrt(jnp.sum(ax * ax, axis=axis, keepdims=keepdims))
    return jnp.sum(ax ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)


@op(aten.linalg_vector_norm.default)
def _linalg_vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = _norm_compute_dtype(x, dtype)
    if dim is not None and not isinstance(dim, (list, tuple)):
        dim = [dim]
    axis = None if dim is None or len(dim) == 0 else tuple(d % max(x.ndim, 1) for d in dim)
    if x.ndim == 0:
        axis = None
    return vector_norm(x, float(ord), axis, keepdim)


@op(aten.linalg_cross.default)
def _linalg_cross(ctx, a, b, *, dim=-1):
    compute, _ = ctx.promote(PROMOTE.DEFAULT, args=ctx.node.args[:2])
    a, b = as_dtype(a, compute), as_dtype(b, compute)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    dim = dim % len(shape)
    a0, a1, a2 = (lax.index_in_dim(a, i, dim, keepdims=True) for i in range(3))
    b0, b1, b2 = (lax.index_in_dim(b, i, dim, keepdims=True) for i in range(3))
    return jnp.concatenate([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=dim)


def _pairwise(diff, p):
    return vector_norm(diff, float(p), -1, False)


@op(aten._cdist_forward.default)
def _cdist_forward(ctx, x1, x2, p, compute_mode=None):
    out_dtype = ctx.out_dtype
    x1, x2 = x1.astype(out_dtype), x2.astype(out_dtype)
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    r1, r2 = x1.shape[-2], x2.shape[-2]
    # torch: mode 0 (None) uses the matmul form when either side has more than 25 rows
    use_mm = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and (r1 > 25 or r2 > 25)))
    if use_mm:
        n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
        n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
        a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
        b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
        d2 = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=lax.Precision.HIGHEST)
        return jnp.sqrt(jnp.maximum(d2, 0))
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return _pairwise(diff, p)


@op(aten._pdist_forward.default)
def _pdist_forward(ctx, x, p=2):
    x = x.astype(ctx.out_dtype)
    n = x.shape[0]
    i, j = jnp.triu_indices(n, 1)
    return _pairwise(x[i] - x[j], p)


@op(aten._trilinear.default)
def _trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """nn.functional.bilinear's kernel: unsqueeze each input at its dims, multiply, sum `sumdim`."""
    def expand(x, dims):
        for d in sorted(dims):
            x = jnp.expand_dims(x, d)
        return x

    acc = accumulate_dtype(ctx.out_dtype)
    out = expand(i1.astype(acc), expand1) * expand(i2.astype(acc), expand2) * expand(i3.astype(acc), expand3)
    return jnp.sum(out, axis=tuple(sumdim)) if sumdim else out
