"""FusedGraph: runs a partitioned graph, device regions as compiled programs, host ops eagerly.

Each region is compiled by the driver as a graph of its own (one program per concrete input
signature, so regions downstream of a data-dependent size compile per size at run time).
Between regions, values are torch tensors that alias the device buffers (zero-copy DLPack on
the CPU and on CUDA); host ops run in eager torch on them.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from torchtpu import counters, events
from torchtpu.compiler import checks
from torchtpu.passes import defer_and_fuse as daf


class HostFallbackWarning(UserWarning):
    """A fullgraph=True graph runs some ops on the host between device programs."""


def compile_fused(gm: torch.fx.GraphModule, example_inputs, options, name: str,
                  compile_region: Callable) -> "FusedGraph":
    """Partitions `gm` and compiles each device region with `compile_region`.

    Args:
        gm: the ATen graph.
        example_inputs: one per placeholder (fake or real).
        options: backend Options; mode "strict" gives one region per device op.
        name: the graph's name in events and dumps.
        compile_region: the driver's compile_graph(gm, example_inputs, options, name).

    Returns:
        A boxed callable like the driver's CompiledGraph.
    """
    strict = options.mode == "strict"
    plan = daf.partition(gm, strict=strict)
    region_options = dataclasses.replace(options, mode="fused")  # a region has no host op left
    runners = [_compile_region(gm, region, region_options, f"{name}_r{region.index}", compile_region, strict)
               for region in plan.regions]
    counters.bump("device_regions", len(plan.regions))
    counters.bump("fallback_ops", len(plan.host_ops))
    events.record("defer_and_fuse", graph=name, mode=options.mode, device_regions=len(plan.regions),
                  naive_regions=plan.naive_regions, host_ops=plan.host_ops, transfers_per_call=plan.transfers,
                  region_sizes=[len(r.nodes) for r in plan.regions])
    if plan.host_ops and _fullgraph():
        warnings.warn(f"torchtpu: {name} (fullgraph=True) runs {len(plan.host_ops)} op(s) on the host between "
                      f"{len(plan.regions)} device program(s): {', '.join(sorted(set(plan.host_ops)))}",
                      HostFallbackWarning)
    return FusedGraph(gm, plan, runners, name)


_STRICT_PROGRAMS: dict[tuple, Callable] = {}  # (op, arguments, input signature) -> runner


def _compile_region(gm, region, options, name, compile_region, strict):
    sub = daf.region_module(gm, region)
    example = [_example(gm, a) for a in region.inputs]
    if any(free_unbacked_symbols(x) for x in example if isinstance(x, (torch.Tensor, torch.SymInt))):
        # Sizes known only at run time (nonzero, .item()) have no range to bucket: compile
        # per concrete size, as the data gives it.
        options = dataclasses.replace(options, bucketing="off")
    if not strict:
        return compile_region(sub, example, options, name=name)
    key = _op_key(region, example)  # strict: the same op on the same signature is compiled once
    runner = _STRICT_PROGRAMS.get(key)
    if runner is None:
        runner = _STRICT_PROGRAMS[key] = compile_region(sub, example, options, name=name)
    return runner


def _op_key(region, example) -> tuple:
    slot = {a: f"in{i}" for i, a in enumerate(region.inputs)}
    slot.update({n: f"v{i}" for i, n in enumerate(region.nodes)})
    ops = tuple((str(n.target), repr(torch.fx.node.map_arg((n.args, n.kwargs), slot.get))) for n in region.nodes)
    outs = tuple(slot[n] for n in region.outputs)
    return ops, outs, tuple(_signature(x) for x in example)


def _signature(x):
    if isinstance(x, torch.Tensor):
        return (tuple(str(s) for s in x.shape), x.dtype, tuple(str(s) for s in x.stride()))
    return str(x)


def _example(gm, node):
    if node.op == "get_attr":
        return getattr(gm, node.target)
    return node.meta.get("val")


def _fullgraph() -> bool:
    """Whether Dynamo is tracing this graph with fullgraph=True (False when not called from Dynamo)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return bool(InstructionTranslator.current_tx().one_graph)
    except (AttributeError, ImportError):
        return False


class FusedGraph:
    """Runs the plan: host steps in eager torch, region steps through their compiled runners.

    Args:
        gm: the ATen graph (for constants and the output order).
        plan: the Partition.
        runners: one compiled runner per region, in region order.
        name: the graph's name.
    """

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, plan: daf.Partition, runners: list, name: str):
        self.plan = plan
        self.name = name
        nodes = list(gm.graph.nodes)
        self._placeholders = [n for n in nodes if n.op == "placeholder"]
        self._constants = {n: getattr(gm, n.target) for n in nodes if n.op == "get_attr"}
        self._output = next(n for n in nodes if n.op == "output")
        self._steps = [(kind, runners[step.index] if kind == "region" else None, step) for kind, step in plan.steps]
        self._last_use = _last_uses(plan.steps, self._output)

    def __call__(self, args: list):
        env = dict(zip(self._placeholders, args))
        env.update(self._constants)
        args.clear()
        for i, (kind, runner, step) in enumerate(self._steps):
            if kind == "host":
                a, kw = torch.fx.node.map_arg((step.args, step.kwargs), env.__getitem__)
                env[step] = step.target(*a, **kw)
            else:
                try:
                    outs = runner([env[a] for a in step.inputs])
                except (checks.ProgramIndexError, checks.ProgramCheckError) as error:
                    raise checks.user_error(error.check, _checked_node(step, error)) from None
                env.update(zip(step.outputs, outs))
            for dead in self._last_use.get(i, ()):  # free what no later step reads
                env.pop(dead, None)
        counters.bump("transfers", self.plan.transfers)
        return list(torch.fx.node.map_arg(self._output.args[0], env.__getitem__))


def _checked_node(region, error):
    """The node of `region` whose run-time check failed. Strict mode shares one program between
    equal ops of any graph, so the program's own node may be another op's (another line)."""
    node = next((n for n in region.nodes if n.name == getattr(error.node, "name", None)), None)
    if node is None or str(node.target) != error.check["lowered"]:
        node = next((n for n in region.nodes if str(n.target) == error.check["lowered"]), error.node)
    return node


def _last_uses(steps, output) -> dict[int, list]:
    """step index -> the values it is the last reader of (graph outputs are kept)."""
    keep = set(output.all_input_nodes)
    last: dict = {}
    for i, (kind, step) in enumerate(steps):
        for a in (step.inputs if kind == "region" else step.all_input_nodes):
            last[a] = i
    out: dict[int, list] = {}
    for value, i in last.items():
        if value not in keep:
            out.setdefault(i, []).append(value)
    return out
