"""A direct call path for inference graphs that AOTAutograd's runtime wrappers have nothing to do for.

AOTAutograd wraps every compiled graph in runtime code that replays input mutations, rebuilds
outputs that alias inputs, threads effect tokens and RNG state, and turns grad mode off around
inference graphs. When its metadata says none of that applies (no mutated input, every output
a fresh tensor, no tokens, no tensor subclasses, no lifted parameters), the wrapper only costs
time per call, and Dynamo can call our runner directly. Anything else keeps AOTAutograd's wrapper.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._functorch._aot_autograd.schemas import OutputType, SubclassCreationMeta

from torchtpu import events


def needs_wrapper(meta, gm: torch.fx.GraphModule, graph_inputs: int, example_inputs) -> str | None:
    """Why AOTAutograd's runtime wrapper is needed, or None when a direct call is equivalent."""
    if meta is None:
        return "no AOTAutograd metadata"
    if any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info):
        return "an input is mutated"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or another output"
    if meta.num_intermediate_bases or meta.tokens or meta.num_graphsafe_rng_states:
        return "intermediate bases, effect tokens or RNG state"
    if any(isinstance(m, SubclassCreationMeta) for m in meta.subclass_inp_meta):
        return "tensor subclass inputs"
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return "parameters lifted from the graph module"
    if graph_inputs != len(example_inputs):
        return "inputs deduplicated or added by AOTAutograd"
    return None


def direct(runner: Callable, graph: str) -> Callable:
    """Dynamo's calling convention (`fn(*args)`) straight onto a boxed runner."""
    events.record("call_path", graph=graph, path="direct")

    def call(*args):
        return runner(list(args))  # fresh tensors from the device: they never require grad

    call.runner = runner  # what it calls (benchmarks/call_overhead.py times the two apart)
    return call
