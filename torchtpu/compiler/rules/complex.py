"""Complex numbers: construction, views as (real, imag) pairs, parts, conjugation, angle."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import numpy as np
import torch

from torchtpu.compiler.context import PROMOTE, as_dtype
from torchtpu.compiler.registry import op

aten = torch.ops.aten


def _real_dtype(dtype):
    return np.finfo(dtype).dtype if jnp.issubdtype(dtype, jnp.complexfloating) else dtype


@op(aten.view_as_complex.default)
def _view_as_complex(ctx, x):
    return lax.complex(x[..., 0], x[..., 1])


@op(aten.view_as_real.default)
def _view_as_real(ctx, x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@op(aten.complex.default)
def _complex(ctx, re, im):
    out = ctx.out_dtype
    part = _real_dtype(out)
    re, im = jnp.broadcast_arrays(as_dtype(re, part), as_dtype(im, part))
    return lax.complex(re, im)


@op(aten.polar.default)
def _polar(ctx, r, theta):
    part = _real_dtype(ctx.out_dtype)
    r, theta = jnp.broadcast_arrays(as_dtype(r, part), as_dtype(theta, part))
    return lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@op(aten.real.default)
def _real(ctx, x):
    return jnp.real(x)


@op(aten.imag.default)
def _imag(ctx, x):
    if not jnp.iscomplexobj(x):
        raise TypeError("imag is not implemented for tensors with non-complex dtypes (as in torch)")
    return jnp.imag(x)


@op(aten._conj.default, aten.conj_physical.default, aten._conj_physical.default,
    aten.resolve_conj.default, aten.resolve_neg.default)
def _conj(ctx, x):
    if ctx.node.target is aten.resolve_neg.default or ctx.node.target is aten.resolve_conj.default:
        return x  # the values are materialized already; the bits are views' metadata
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@op(aten.angle.default)
def _angle(ctx, x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    compute, _ = ctx.promote(PROMOTE.INT_TO_FLOAT, args=ctx.node.args[:1])
    x = as_dtype(x, compute)
    # torch: pi for negatives, 0 otherwise, NaN stays NaN
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(np.pi, compute), jnp.zeros((), compute)))


@op(aten._neg_view.default)
def _neg_view(ctx, x):
    return -x
