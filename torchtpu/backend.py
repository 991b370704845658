"""The Dynamo backend "tpu": AOTAutograd in front, compile_graph behind.

Registered through the `torch_dynamo_backends` entry point, so
`torch.compile(model, backend="tpu")` works without importing torchtpu.
"""
from __future__ import annotations

import functools

import torch
from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

from torchtpu import counters, events, recompile_limit, spmd
from torchtpu.compiler import worker
from torchtpu.compiler.decompositions import decomposition_table
from torchtpu.compiler.driver import compile_graph
from torchtpu.compiler.lower import output_metas
from torchtpu.options import Options
from torchtpu.precompile.output_code import CachedSignature, TpuOutputCode
from torchtpu.precompile.saved_graph import SavedGraph
from torchtpu.runtime import boundary, lean, passthrough
from torchtpu.runtime import platform as platforms
from torchtpu.runtime.executable import CompiledGraph


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
    if (opts.platform or platforms.default_platform()) == "cpu":
        worker.enable()  # XLA's compiles go to a process of their own (started at the first cache miss)
    events.follow_dynamo()  # from now on, each frame's Dynamo record is logged as its compile ends
    events.record("graph", compile_id=_compile_id(), source=_source(gm), inputs=_describe(example_inputs),
                  ops=sum(n.op == "call_function" for n in gm.graph.nodes), options=opts.key_items(),
                  automatic_dynamic=torch._dynamo.config.automatic_dynamic_shapes)
    if precompiling():  # torch's aot_compile or caching precompile: AOTAutograd's result serializes
        return _compile(gm, example_inputs, opts, serializable=True)
    last = recompile_limit.last_compile()  # None unless Dynamo's limit refuses this frame's next compile
    compiled = _compile(gm, example_inputs, opts)
    return compiled if last is None else recompile_limit.arm_on_first_call(last, compiled)


def precompiling() -> bool:
    """True while torch's precompile path compiles (aot_compile, or Dynamo's caching precompile):
    it bundles each graph into its artifact."""
    return bool(torch._functorch.config.bundled_autograd_cache or torch._dynamo.config.caching_precompile)


def _compile(gm: torch.fx.GraphModule, example_inputs, opts: Options, serializable: bool = False):
    """AOTAutograd's graphs through compile_graph; the direct call path where nothing needs its wrapper.

    With `serializable`, each graph comes back as a TpuOutputCode and AOTAutograd's own result is
    returned (it carries them into torch's precompiled artifact)."""
    if serializable and opts.mesh is not None:
        raise NotImplementedError("torchtpu: a program over a device mesh cannot be precompiled yet "
                                  "(its sharded executables have no cache format): compile it in process")
    # with a mesh, parameters are sharded by name: find which graph inputs they are
    spmd_inputs = spmd.graph_inputs(gm, opts.tp_plan) if opts.mesh is not None else None

    inference = {}
    saved = {}  # the forward's saved tensors' layouts, for its backward (runtime/boundary.py)

    def compiler(name):
        def prepare(aten_gm, aten_inputs):
            """(the outputs `passthrough.split` took out of a forward graph, the graph's boundary
            layouts), before the graph is compiled."""
            if name == "forward":
                outputs = output_metas(aten_gm.graph.find_nodes(op="output")[0])  # before the split
                pairs = passthrough.split(aten_gm)  # the saved primals: the caller's own tensors
                start = boundary.saved_start(_fw_metadata(), pairs)
                saved.update(outputs=outputs, start=start)
                return pairs, boundary.forward(start)
            if name == "backward":
                return (), boundary.backward(saved.get("layouts"), aten_inputs)
            return (), None

        def build(aten_gm, aten_inputs, pairs, layouts):
            """(the graph's runner, the positions of its resident inputs)."""
            counters.bump("aot_graphs")
            meta = _fw_metadata()
            resident = _resident(meta, name)
            runner = compile_graph(aten_gm, aten_inputs, opts, name=name, spmd_inputs=spmd_inputs,
                                   resident=resident, boundary=layouts)
            if name == "forward" and meta is not None and isinstance(runner, CompiledGraph):
                # the saved activations, among the outputs the program still returns
                runner.dense_outputs_from = saved["start"]
                saved["layouts"] = boundary.saved(saved["outputs"], meta, pairs, runner)
            if name == "inference":
                inference.update(runner=runner, meta=meta, inputs=len(aten_gm.graph.find_nodes(op="placeholder")))
            return runner, resident

        if not serializable:
            def compile_fn(aten_gm, aten_inputs):
                pairs, layouts = prepare(aten_gm, aten_inputs)
                return passthrough.wrap(build(aten_gm, aten_inputs, pairs, layouts)[0], pairs)
            return compile_fn

        def output_code_fn(aten_gm, aten_inputs):
            pairs, layouts = prepare(aten_gm, aten_inputs)
            graph = SavedGraph.of(aten_gm, aten_inputs)  # before the passes change the graph
            runner, resident = build(aten_gm, aten_inputs, pairs, layouts)
            return TpuOutputCode(graph, opts, name, resident, getattr(runner, "dense_outputs_from", None),
                                 CachedSignature.of(runner), passthrough.wrap(runner, pairs), pairs, layouts)
        return SerializableAOTDispatchCompiler(TpuOutputCode, output_code_fn)

    wrapped = aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
    )
    if not inference or serializable:
        return wrapped
    why = lean.needs_wrapper(inference["meta"], gm, inference["inputs"], example_inputs)
    if why is not None:
        events.record("call_path", graph=inference["runner"].name, path="aot_autograd", reason=why)
        return wrapped
    return lean.direct(inference["runner"], inference["runner"].name)


def _resident(meta, name: str) -> frozenset[int]:
    """Positions of the parameters and buffers among a forward or inference graph's inputs."""
    return frozenset(meta.static_input_indices) if meta and name != "backward" else frozenset()


def _fw_metadata():
    context = torch._guards.TracingContext.try_get()
    return context.fw_metadata if context is not None else None


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
