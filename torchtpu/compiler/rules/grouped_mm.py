"""Grouped matrix products (MoE experts): `aten._grouped_mm` in its four layouts, and
transformers' `grouped_mm_fallback` (+ backward), the custom op its MoE layers call where
`_grouped_mm` cannot be traced (torch 2.13 traces `_grouped_mm` in bfloat16 only).

`offs[g]` ends group g along the ragged dimension; whatever lies past `offs[-1]` is in no
group and comes out zero (eager's `_grouped_mm` leaves it unwritten):

| mat_a | mat_b | out | ragged dimension |
|---|---|---|---|
| [M, K] | [G, K, N] | [M, N] | rows of mat_a |
| [G, M, K] | [K, N] | [M, N] | columns of mat_b |
| [M, K] | [K, N] | [G, M, N] | the contraction (K) |
| [G, M, K] | [G, K, N] | [G, M, N] | none: a batched matmul (offs is None) |

AOTAutograd's backward of `_grouped_mm` is `_grouped_mm` again on transposed operands
(rows-ragged forward: rows- and contraction-ragged backward; contraction-ragged forward:
rows- and columns-ragged), so these rules cover training as they are.

Per node, `kernels.choose` picks JAX's megablox kernels (kernels/grouped_matmul.py) on a
TPU target (float32 only under torch's matmul precision "medium": their matmuls are
bfloat16-precise, `kernels.precision_gap`), ATen's own `_grouped_mm` as a custom call on the
CPU (kernels/aten_cpu.py: XLA:CPU's ragged dot is a dense product masked per group, G times
the work: docs/DECISIONS.md 79) and `lax.ragged_dot_general` elsewhere; the batched form is a
dot everywhere.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
import torch

from torchtpu import kernels
from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.conv import use_aten
from torchtpu.compiler.rules.linalg import precision
from torchtpu.compiler.rules.reduction import accumulate_dtype
from torchtpu.kernels import aten_cpu
from torchtpu.kernels import grouped_matmul as megablox

aten = torch.ops.aten

_ROWS = lax.RaggedDotDimensionNumbers((([1], [1]), ([], [])), lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
_CONTRACTION = lax.RaggedDotDimensionNumbers((([1], [0]), ([], [])), lhs_ragged_dimensions=[1],
                                             rhs_group_dimensions=[])


def _sizes(offs):
    """Group sizes from torch's group ends."""
    offs = offs.astype(jnp.int32)
    return jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(a, b, sizes, dims, acc):
    return lax.ragged_dot_general(a, b, sizes, dims, precision=precision(), preferred_element_type=acc)


def grouped_mm(ctx, a, b, offs):
    """torch._grouped_mm(a, b, offs), accumulated in float32 for bfloat16 operands."""
    acc = accumulate_dtype(jnp.result_type(a, b))
    if a.ndim == 3 and b.ndim == 3:
        return jnp.matmul(a, b, precision=precision(), preferred_element_type=acc)
    sizes = _sizes(offs)
    choice = kernels.choose(ctx, "grouped_matmul", megablox.supports(a, b),
                            mosaic_why_not=kernels.precision_gap(jnp.result_type(a, b)))
    if choice != kernels.XLA:
        with kernels.running(choice):
            if b.ndim == 3:
                return megablox.gmm(a, b, sizes)
            if a.ndim == 3:
                return megablox.gmm(b.T, a, sizes, transpose_rhs=True).T
            return megablox.tgmm(a, b, sizes)
    if use_aten(ctx) and aten_cpu.one_dtype(a, b):
        return aten_cpu.grouped_mm(a, b, offs, _out_shape(a, b, offs))
    if ctx.platform not in ("gpu", "tpu"):  # XLA:CPU's DotThunk lacks bf16 x bf16 -> f32 (exact in f32)
        a, b = a.astype(acc), b.astype(acc)
    if b.ndim == 3:
        return _ragged(a, b, sizes, _ROWS, acc)
    if a.ndim == 3:  # out^T = b^T @ a[g]^T, ragged in b^T's rows
        return _ragged(b.T, jnp.swapaxes(a, 1, 2), sizes, _ROWS, acc).T
    return _ragged(a, b, sizes, _CONTRACTION, acc)


def _out_shape(a, b, offs) -> tuple:
    if b.ndim == 3:
        return (a.shape[0], b.shape[2])
    if a.ndim == 3:
        return (a.shape[1], b.shape[1])
    return (offs.shape[0], a.shape[0], b.shape[1])


@op(aten._grouped_mm.default)
def _grouped_mm(ctx, a, b, offs=None, bias=None, out_dtype=None):
    if bias is not None:  # unreachable from torch 2.13, whose meta function rejects a bias
        raise NotImplementedError("_grouped_mm with a bias")
    return grouped_mm(ctx, a, b, offs)  # out_dtype: the result is cast to the node's dtype


@op("transformers.grouped_mm_fallback.default")
def _hf_grouped_mm(ctx, x, weight, offs):
    return grouped_mm(ctx, x, weight, offs)


@op("transformers.grouped_mm_fallback_backward.default")
def _hf_grouped_mm_backward(ctx, x, weight, offs, grad):
    return grouped_mm(ctx, grad, jnp.swapaxes(weight, 1, 2), offs), grouped_mm(ctx, x.T, grad, offs)
