"""The Dynamo backend "tpu": AOTAutograd in front, compile_graph behind.

Registered through the `torch_dynamo_backends` entry point, so
`torch.compile(model, backend="tpu")` works without importing torchtpu.
"""
from __future__ import annotations

import functools

import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torchtpu import counters
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
