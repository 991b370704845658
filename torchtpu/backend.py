"""The Dynamo backend "tpu": AOTAutograd in front, compile_graph behind.

Registered through the `torch_dynamo_backends` entry point, so
`torch.compile(model, backend="tpu")` works without importing torchtpu.
"""
from __future__ import annotations

import functools

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torchtpu import counters, events
from torchtpu.compiler.decompositions import decomposition_table
from torchtpu.compiler.driver import compile_graph
from torchtpu.options import Options


def tpu_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Dynamo backend entry: `torch.compile(model, backend="tpu", options={...})`.

    Args:
        gm: Dynamo's FX graph (torch IR).
        example_inputs: its example inputs (fake tensors, SymInts).
        options: backend options, see torchtpu.options.Options.
    """
    if kwargs.get("mode") not in (None, "default"):
        raise ValueError(f"torchtpu: mode={kwargs['mode']!r} is not supported; pass options={{...}} instead")
    opts = Options.parse(options)
    counters.bump("dynamo_graphs")
    events.sync_dynamo()  # Dynamo records a frame's metrics after its backend returns
    events.record("graph", compile_id=_compile_id(), source=_source(gm), inputs=_describe(example_inputs),
                  ops=sum(n.op == "call_function" for n in gm.graph.nodes), options=opts.key_items())

    def compiler(name):
        def compile_fn(aten_gm, aten_inputs):
            counters.bump("aot_graphs")
            return compile_graph(aten_gm, aten_inputs, opts, name=name)
        return compile_fn

    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
    )


def _compile_id() -> str | None:
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else None


def _source(gm) -> str | None:
    """The user's line that produced the graph's first op (Dynamo keeps a stack per node)."""
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if trace:
            lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
            return lines[0] if lines else None
    return None


def _describe(example_inputs) -> list[str]:
    out = []
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            out.append(f"{str(x.dtype).removeprefix('torch.')}[{','.join(str(s) for s in x.shape)}]")
        else:
            out.append(str(x))
    return out
