"""RMSNorm and LayerNorm as Pallas kernels of our own (TPU Mosaic, or interpret mode).

The input is viewed as rows [N, D] (D = the normalised size). A grid step holds a block of
rows in VMEM: the forward writes y and the per-row statistics (mean, rstd) that torch saves
for backward; the backward writes dx per block and accumulates dw/db across the grid (the
grid axis is therefore sequential, "arbitrary"). Rows are padded to the block with zeros:
padded rows have finite statistics and zero gradients, and are sliced away.

`rms_norm` / `layer_norm` are custom_vjp functions for JAX callers; the lowering rules call
the `*_fwd` / `*_bwd` halves directly because AOTAutograd hands forward and backward to us
as separate programs (the backward gets the saved statistics as inputs).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_VMEM_BLOCK_BYTES = 1 << 20  # one f32 [rows, D] block; several live at once, well under v5e's 16 MiB


def _block_rows(n: int, d: int) -> int:
    # multiples of 16 rows: bf16 packs two rows per sublane
    rows = max(16, min(512, 2 ** int(math.log2(max(1, _VMEM_BLOCK_BYTES // (4 * d))))))
    return min(rows, -(-n // 16) * 16)


def _fwd_kernel(x_ref, w_ref, b_ref, y_ref, mean_ref, rstd_ref, *, eps, rms):
    x = x_ref[...].astype(jnp.float32)
    mean = jnp.zeros((x.shape[0], 1), jnp.float32) if rms else jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mean
    rstd = jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)
    y = xc * rstd * w_ref[...].astype(jnp.float32) + b_ref[...].astype(jnp.float32)
    y_ref[...] = y.astype(y_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _bwd_kernel(g_ref, x_ref, w_ref, mean_ref, rstd_ref, dx_ref, dw_ref, db_ref, *, rms):
    @pl.when(pl.program_id(0) == 0)
    def _init():
        dw_ref[...] = jnp.zeros_like(dw_ref)
        db_ref[...] = jnp.zeros_like(db_ref)

    g = g_ref[...].astype(jnp.float32)
    rstd = rstd_ref[...]
    xhat = (x_ref[...].astype(jnp.float32) - mean_ref[...]) * rstd
    gw = g * w_ref[...].astype(jnp.float32)
    proj = jnp.mean(gw * xhat, axis=-1, keepdims=True)
    centred = gw if rms else gw - jnp.mean(gw, axis=-1, keepdims=True)
    dx_ref[...] = (rstd * (centred - xhat * proj)).astype(dx_ref.dtype)
    dw_ref[...] += jnp.sum(g * xhat, axis=0, keepdims=True)
    db_ref[...] += jnp.sum(g, axis=0, keepdims=True)


def _rows(x, d):
    n = x.size // d
    r = _block_rows(n, d)
    n_pad = -(-n // r) * r
    x2 = x.reshape(n, d)
    return (jnp.pad(x2, ((0, n_pad - n), (0, 0))) if n_pad != n else x2), n, r


def _params(w, d, fill, dtype):
    return jnp.full((1, d), fill, dtype) if w is None else w.reshape(1, d)


def norm_fwd(x, weight, bias, eps: float, *, d: int, rms: bool, interpret: bool = False):
    """y, mean, rstd of a norm over the trailing `d` elements of each row of x.

    Returns y (x's shape and dtype) and mean, rstd as float32 [N, 1] (N = x.size // d;
    mean is zeros for RMSNorm).
    """
    x2, n, r = _rows(x, d)
    n_pad = x2.shape[0]
    row = pl.BlockSpec((r, d), lambda i: (i, 0))
    stat = pl.BlockSpec((r, 1), lambda i: (i, 0))
    whole = pl.BlockSpec((1, d), lambda i: (0, 0))
    y, mean, rstd = pl.pallas_call(
        functools.partial(_fwd_kernel, eps=float(eps), rms=rms),
        grid=(n_pad // r,),
        in_specs=[row, whole, whole],
        out_specs=[row, stat, stat],
        out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype),
                   jax.ShapeDtypeStruct((n_pad, 1), jnp.float32),
                   jax.ShapeDtypeStruct((n_pad, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
        interpret=interpret,
        name="torchtpu_rms_norm_fwd" if rms else "torchtpu_layer_norm_fwd",
    )(x2, _params(weight, d, 1, x.dtype), _params(bias, d, 0, x.dtype))
    return y[:n].reshape(x.shape), mean[:n], rstd[:n]


def norm_bwd(g, x, weight, mean, rstd, *, d: int, rms: bool, interpret: bool = False):
    """dx (x's shape and dtype), dweight and dbias (float32 [d]) of norm_fwd, from its statistics."""
    g2, n, r = _rows(g, d)
    x2, _, _ = _rows(x, d)
    n_pad = x2.shape[0]
    pad = ((0, n_pad - n), (0, 0))
    mean = jnp.pad(mean.reshape(n, 1).astype(jnp.float32), pad)
    rstd = jnp.pad(rstd.reshape(n, 1).astype(jnp.float32), pad, constant_values=1.0)
    row = pl.BlockSpec((r, d), lambda i: (i, 0))
    stat = pl.BlockSpec((r, 1), lambda i: (i, 0))
    whole = pl.BlockSpec((1, d), lambda i: (0, 0))
    dx, dw, db = pl.pallas_call(
        functools.partial(_bwd_kernel, rms=rms),
        grid=(n_pad // r,),
        in_specs=[row, row, whole, stat, stat],
        out_specs=[row, whole, whole],
        out_shape=[jax.ShapeDtypeStruct(x2.shape, x.dtype),
                   jax.ShapeDtypeStruct((1, d), jnp.float32),
                   jax.ShapeDtypeStruct((1, d), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=interpret,
        name="torchtpu_rms_norm_bwd" if rms else "torchtpu_layer_norm_bwd",
    )(g2, x2, _params(weight, d, 1, x.dtype), mean, rstd)
    return dx[:n].reshape(x.shape), dw.reshape(d), db.reshape(d)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _norm(x, weight, bias, eps, rms, interpret):
    return norm_fwd(x, weight, bias, eps, d=x.shape[-1], rms=rms, interpret=interpret)[0]


def _norm_vjp_fwd(x, weight, bias, eps, rms, interpret):
    y, mean, rstd = norm_fwd(x, weight, bias, eps, d=x.shape[-1], rms=rms, interpret=interpret)
    return y, (x, weight, bias, mean, rstd)


def _norm_vjp_bwd(eps, rms, interpret, res, g):
    x, weight, bias, mean, rstd = res
    dx, dw, db = norm_bwd(g, x, weight, mean, rstd, d=x.shape[-1], rms=rms, interpret=interpret)
    return dx, dw.astype(weight.dtype), (None if bias is None else db.astype(bias.dtype))


_norm.defvjp(_norm_vjp_fwd, _norm_vjp_bwd)


def rms_norm(x, weight, eps: float = 1e-6, *, interpret: bool = False):
    """x * rsqrt(mean(x^2, -1) + eps) * weight over the last axis, differentiable (custom_vjp)."""
    return _norm(x, weight, None, eps, True, interpret)


def layer_norm(x, weight, bias, eps: float = 1e-5, *, interpret: bool = False):
    """LayerNorm over the last axis, differentiable (custom_vjp)."""
    return _norm(x, weight, bias, eps, False, interpret)
