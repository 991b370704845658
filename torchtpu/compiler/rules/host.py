"""Ops whose results the device cannot produce inside one static program: a host sync
(`.item()`) and data-dependent output shapes. They are registered so the error is precise;
running them between device programs is the DeferAndFuse pass's job."""
from __future__ import annotations

import torch

from torchtpu.compiler.registry import op

aten = torch.ops.aten

_WHY = {
    aten._local_scalar_dense.default: "reads a tensor value on the host (.item()) inside the graph",
    aten.nonzero.default: "has an output shape that depends on the data",
    aten.masked_select.default: "has an output shape that depends on the data",
}


@op(*_WHY)
def _host_only(ctx, *args, **kwargs):
    raise NotImplementedError(
        f"{ctx.node.target} {_WHY[ctx.node.target]}, which one static XLA program cannot express. "
        "Compute it outside the compiled region (or let Dynamo graph-break there: fullgraph=False)."
    )
