"""compile_graph: the one driver from an ATen FX graph to a runnable executable."""
from __future__ import annotations

import itertools
import time

import jax
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torchtpu import counters, events
from torchtpu.compiler import dump
from torchtpu.compiler.lower import to_jax_program
from torchtpu.compiler.spec import describe, is_static, spec_of
from torchtpu.options import Options
from torchtpu.passes import run_passes
from torchtpu.runtime import platform as platforms
from torchtpu.runtime.executable import CompiledGraph, Executable

_graph_ids = itertools.count()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, options: Options | None = None,
                  name: str = "graph") -> CompiledGraph:
    """Compiles an ATen FX graph (as AOTAutograd hands it over) for the process's platform.

    Args:
        gm: the graph, in Core ATen.
        example_inputs: fake or real tensors and SymInts, one per placeholder.
        options: backend Options.
        name: shown in dumps and the compile-event record.

    Returns:
        A boxed callable (takes the argument list) that returns the graph's outputs as
        torch values. It holds one executable per concrete input signature; when the
        example inputs are fully static that executable is built here, so lowering errors
        surface at compile time.
    """
    options = options or Options()
    name = f"{name}_{next(_graph_ids)}"
    gm = run_passes(gm, options)                          # 1. graph passes
    target = options.platform or platforms.default_platform()
    device = platforms.device(target)

    def build(spec: tuple) -> Executable:
        program = to_jax_program(gm, spec, target, options, device)  # 2. ATen -> JAX function
        t0 = time.perf_counter()
        with jax.enable_x64(True):
            lowered = jax.jit(program.fn).trace(*program.avals).lower()  # 3. -> StableHLO
            t1 = time.perf_counter()
            compiled = lowered.compile()                  # 4. XLA compile via PJRT
        t2 = time.perf_counter()
        counters.bump("xla_compiles")
        counters.add_seconds("lower", t1 - t0)
        counters.add_seconds("compile", t2 - t1)
        events.record("compile", graph=name, signature=describe(spec), platform=target,
                      lower_ms=round((t1 - t0) * 1e3, 3), compile_ms=round((t2 - t1) * 1e3, 3))
        dump.write(options, name, gm, spec, lowered, t1 - t0, t2 - t1)
        return Executable(compiled, program, device)      # 5. runtime wrapper

    runner = CompiledGraph(build, name)
    if is_static(example_inputs):
        with unset_fake_temporarily():  # AOTAutograd calls us under its fake mode
            runner.executable_for(spec_of(example_inputs))
    return runner
