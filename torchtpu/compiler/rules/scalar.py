"""Symbolic-size queries. Sizes are concrete while a signature is lowered, so these are
Python values, not device work."""
from __future__ import annotations

import math

import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten


@op(aten.sym_size.int)
def _sym_size(ctx, x, dim):
    return int(x.shape[dim])


@op(aten.sym_numel.default)
def _sym_numel(ctx, x):
    return int(math.prod(x.shape))


@op(aten.sym_stride.int)
def _sym_stride(ctx, x, dim):
    # Inputs reach the program contiguous.
    return int(math.prod(x.shape[dim + 1:]))


@op(aten.sym_storage_offset.default)
def _sym_storage_offset(ctx, x):
    return 0


@op(aten._assert_scalar.default)
def _assert_scalar(ctx, cond, message):
    # Dynamo's runtime checks on (unbacked) sizes. Sizes are concrete here, except under
    # bucketing, where the check is about the true sizes and the program's are padded.
    if isinstance(cond, bool) and not cond and ctx.padding is None:
        raise ValueError(f"size check failed: {message}")
    return None
