"""torch.ops.prims ops that some decompositions leave in ATen graphs."""
from __future__ import annotations

import torch

from torchtpu.compiler import dtypes
from torchtpu.compiler.registry import op

prims = torch.ops.prims


@op(prims.convert_element_type.default)
def _convert_element_type(ctx, x, dtype):
    return dtypes.convert(x, ctx.out_dtype, ctx.platform)
