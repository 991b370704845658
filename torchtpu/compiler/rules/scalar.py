"""Symbolic-size queries and asserts. Sizes are concrete while a signature is lowered, so these
are Python values, not device work; an assert on a tensor value is a check of the program's
flag (compiler/checks.py)."""
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


@op(aten._assert_async.default, aten._assert_async.msg)
def _assert_async(ctx, cond, message="Expected Tensor with single nonzero value, but got zero"):
    # torch's assert on a tensor value (one_hot's class range, torch._assert_async): raised after
    # the call, as torch raises it; gone with check_indices=False, as every run-time check is.
    if ctx.checks is not None:
        op = ctx.node.meta.get("original_aten") or ctx.node.target
        ctx.checks.require(cond != 0, ctx.node, "RuntimeError", message, str(op))
    return None
