"""Which ATen ops are decomposed before lowering.

Core ATen is the contract: torch's core decompositions bring every graph down to it, and
every Core ATen overload either has a rule here or is listed in DECOMPOSED_CORE, whose
torch decompositions we apply on purpose (fewer rules, same numbers).
"""
from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

aten = torch.ops.aten

# Core ATen ops whose torch decomposition we use instead of a rule of our own.
DECOMPOSED_CORE = [
    aten.upsample_bilinear2d.vec,  # -> index arithmetic + lerp, which XLA fuses
    aten.upsample_nearest2d.vec,  # -> a gather of computed source indices
]

# Non-core ops that survive core_aten_decompositions in real graphs and that torch can
# decompose further.
EXTRA = [
    aten.unfold.default,  # Tensor.unfold: a sliding-window view, torch lowers it to as_strided
    aten.narrow_copy.default,
    aten.dist.default,
    aten.new_empty_strided.default,
    aten._batch_norm_with_update_functional.default,
]

# Ops torch would decompose that we lower directly: the decomposition is wrong for a static
# program (take's reads a 0-d index with .item()) or slower than one XLA op.
LOWERED_DIRECTLY = [
    aten.take.default,
    # one fused attention node per layer (and its backward) for the flash kernel to take
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.native_layer_norm_backward.default,  # a fused backward the norm kernel can take
]


@functools.cache
def decomposition_table() -> dict:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(DECOMPOSED_CORE + EXTRA))
    for op in LOWERED_DIRECTLY:
        table.pop(op, None)
    return table
