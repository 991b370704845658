"""Matrix products. float32 precision follows torch.get_float32_matmul_precision()."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler.rules.reduction import accumulate_dtype
from torchtpu.compiler.registry import op

aten = torch.ops.aten

_PRECISION = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "medium": lax.Precision.DEFAULT}


def precision():
    """torch's float32 matmul precision as XLA's: "highest" keeps full float32 on TPU too."""
    return _PRECISION.get(torch.get_float32_matmul_precision(), lax.Precision.HIGHEST)


def matmul(a, b, out_dtype):
    acc = accumulate_dtype(out_dtype)
    if jnp.issubdtype(out_dtype, jnp.integer) or out_dtype == jnp.bool_:
        return jnp.matmul(a.astype(out_dtype), b.astype(out_dtype))
    return jnp.matmul(a, b, precision=precision(), preferred_element_type=acc)


@op(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(ctx, a, b):
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
    return _scaled_add(ctx, bias, matmul(a, b, ctx.out_dtype), beta, alpha)


@op(aten.addbmm.default)
def _addbmm(ctx, bias, a, b, *, beta=1, alpha=1):
    return _scaled_add(ctx, bias, jnp.sum(matmul(a, b, ctx.out_dtype), axis=0), beta, alpha)
