"""Adapters from torch's grouped matmul to JAX's shipped TPU kernels
(`jax.experimental.pallas.ops.tpu.megablox`: `gmm` and `tgmm`).

`gmm(lhs [m, k], rhs [G, k, n], sizes)` multiplies the rows of group g by rhs[g]; `tgmm(lhs [k, m],
rhs [m, n], sizes)` contracts each group's slice of m into out[g]. The kernels want m to be a
multiple of the row tile and leave rows outside every group unwritten, so the adapters
- pad m with zero rows up to a multiple of the row tile (they belong to no group);
- zero the rows of gmm's result past the last group (torch's rows past offs[-1], and the pad);
- tile k and n by 128, or by the whole dimension when it is smaller (the kernels mask a
  ragged last tile of k and n themselves).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
# the submodule: the package's own `gmm` is the custom_vjp wrapper, whose backward we never use
from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm as _gmm, tgmm as _tgmm

TILE = 128  # the lane width; a smaller dimension is one whole tile
ROWS = 16  # row tiles of a short m are a multiple of this (bf16 packs 16 rows per vreg)


def supports(*operands) -> str | None:
    """Why the kernels cannot take these operands (None: they can)."""
    for x in operands:
        if x.dtype not in (jnp.float32, jnp.bfloat16):
            return f"dtype {x.dtype}"
    return None


def _row_tile(m: int) -> int:
    return TILE if m >= TILE else -(-m // ROWS) * ROWS


def _pad_rows(x, axis: int, size: int):
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def gmm(lhs, rhs, sizes, *, transpose_rhs: bool = False):
    """[m, n] float32: row block g of lhs [m, k] times rhs[g] ([G, k, n], or [G, n, k] transposed);
    rows past sum(sizes) are zero."""
    m, k = lhs.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    tm = _row_tile(m)
    padded = -(-m // tm) * tm
    out = _gmm(_pad_rows(lhs, 0, padded), rhs, sizes.astype(jnp.int32), jnp.float32,
               (tm, min(TILE, k), min(TILE, n)), transpose_rhs=transpose_rhs)
    rows = lax.broadcasted_iota(jnp.int32, out.shape, 0)
    return jnp.where(rows < jnp.sum(sizes), out, 0.0)[:m]  # the kernel leaves those rows unwritten


def tgmm(lhs, rhs, sizes):
    """[G, k, n] float32: out[g] = lhs[:, group g] @ rhs[group g, :] for lhs [k, m], rhs [m, n]."""
    k, m = lhs.shape
    n = rhs.shape[1]
    tm = _row_tile(m)
    padded = -(-m // tm) * tm
    return _tgmm(_pad_rows(lhs, 1, padded), _pad_rows(rhs, 0, padded), sizes.astype(jnp.int32),
                 jnp.float32, (tm, min(TILE, k), min(TILE, n)))
