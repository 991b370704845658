"""compile_graph: the one driver from an ATen FX graph to a runnable executable."""
from __future__ import annotations

import dataclasses
import itertools
import time

import jax
import torch
from jax.experimental.layout import Format, Layout
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torchtpu import cache, counters, events, plans, spmd
from torchtpu.compiler import dump, worker
from torchtpu.compiler.lower import saved_channels_minor, to_jax_program
from torchtpu.compiler.spec import describe, is_static, spec_of
from torchtpu.layout import BOUNDARY, BoundaryLayouts
from torchtpu.options import Options
from torchtpu.passes import defer_and_fuse, run_passes
from torchtpu.runtime import bucketed, fused, heap, target as targets
from torchtpu.runtime.executable import CompiledGraph, Executable, short

_graph_ids = itertools.count()


def compile_graph(gm: torch.fx.GraphModule, example_inputs, options: Options | None = None,
                  name: str = "graph", spmd_inputs: spmd.GraphInputs | None = None,
                  resident: frozenset[int] = frozenset(),
                  boundary: BoundaryLayouts | None = None) -> CompiledGraph:
    """Compiles an ATen FX graph (as AOTAutograd hands it over) for the process's platform.

    Args:
        gm: the graph, in Core ATen.
        example_inputs: fake or real tensors and SymInts, one per placeholder.
        options: backend Options.
        name: shown in dumps and the compile-event record.
        spmd_inputs: which inputs are which parameters (with the mesh option; from the backend).
        resident: positions of the inputs that are parameters or buffers (kept on the device).
        boundary: a forward's or backward's layouts at their boundary (the backend's; used on a
            static CPU graph over CPU tensors, else ignored).

    Returns:
        A boxed callable (takes the argument list) that returns the graph's outputs as
        torch values. It holds one executable per concrete input signature; when the
        example inputs are fully static that executable is built here, so lowering errors
        surface at compile time.
    """
    options = options or Options()
    name = f"{name}_{next(_graph_ids)}"
    # 0. DeferAndFuse: ops the device cannot run (or strict mode) -> one compiled program per
    #    device region, host ops eagerly between them; each region comes back through here.
    if defer_and_fuse.applies(gm, options):
        return fused.compile_fused(gm, example_inputs, options, name, compile_region=compile_graph)
    gm = run_passes(gm, options)                          # 1. graph passes
    target, device = targets.resolve(options)             # the device, or a TPU topology (deviceless AOT)
    placement = spmd.placement_for(gm, options, spmd_inputs, target)  # mesh option: input shardings, else None

    waits = on_host(example_inputs)  # the caller waits for the results (short programs run on its thread)
    if not (boundary is not None and target.platform == "cpu" and device is not None and placement is None
            and waits and is_static(example_inputs) and gm.meta.get(plans.PLAN) is None):
        boundary = None
    elif boundary.saved_from is not None:  # a forward: which saved results XLA lays out its way
        chosen = saved_channels_minor(gm, boundary.saved_from, target.platform, options)
        boundary = dataclasses.replace(boundary, chosen=chosen) if any(chosen) else None
    if boundary:  # part of the cache key (cache/key.py graph_parts)
        gm.meta[BOUNDARY] = boundary

    def build(spec: tuple) -> Executable:
        key = cache.key_for(gm, spec, options, target, name)         # 2. cache key (None: bypass, logged)
        exe = cache.lookup(key, target, device, name, waits)         # 3. memory -> disk
        if exe is not None:
            return exe
        remote = placement is None and target.platform == "cpu" and worker.use()  # compiler process (starting)
        program = to_jax_program(gm, spec, target.platform, options, device, boundary)  # 4. ATen -> JAX function
        lowered, compiled, blob, lower_s, compile_s = _lower_and_compile(  # 5. StableHLO, 6. XLA
            program, placement, spec, options.xla_options, remote)
        counters.bump("xla_compiles")
        counters.add_seconds("lower", lower_s)
        counters.add_seconds("compile", compile_s)
        events.record("compile", graph=name, signature=describe(spec), platform=target.platform,
                      lower_ms=round(lower_s * 1e3, 3), compile_ms=round(compile_s * 1e3, 3))
        dump.write(options, name, gm, spec, lowered, lower_s, compile_s)
        counted = {}
        if placement is None:
            exe = Executable.from_compiled(compiled, program, device, blob)   # 7. runtime wrapper
            if target.platform == "cpu":  # 7b. a short program loaded again to run on the calling thread
                counted["flops"] = exe.flops()
                if waits and short(counted["flops"]):
                    blob = blob or exe.serialize()
                    exe = Executable.deserialize(blob, exe.layout, device, inline=True)
        else:  # partitioned over the mesh by XLA; records the shardings and collectives
            exe = spmd.sharded_executable(compiled, program, placement, spec, target, name)
        cache.store(key, exe, lowered, blob, waits, target=target, graph_name=name, inputs=describe(spec),
                    lower_ms=round(lower_s * 1e3, 3), compile_ms=round(compile_s * 1e3, 3), **counted)  # 8. atomic put
        return exe

    runner = CompiledGraph(build, name, resident, gm)
    runner.waits = waits
    runner = bucketed.wrap(runner, gm, options)           # the pass's bucket plan: pad to buckets, slice back
    if is_static(example_inputs):
        with unset_fake_temporarily():  # AOTAutograd calls us under its fake mode
            runner.fix_signature(spec_of(example_inputs))
    return runner


def on_host(example_inputs) -> bool:
    """Whether the graph's tensors are torch CPU tensors. Its outputs are then CPU tensors, which
    must be ready when the call returns: PJRT's handoff to its worker thread only adds wake-ups,
    so its short CPU programs run on the calling thread (runtime/executable.py `load`). The eager
    device's tensors hold device arrays that need not be ready: its programs keep the handoff,
    and the caller goes on while they run (docs/DECISIONS.md 110)."""
    return all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))


def _lower_and_compile(program, placement=None, spec=(), xla_options=(), remote=False):
    """jax.jit(...).lower() -> StableHLO, .compile() -> XLA via PJRT. Every aval stays a parameter
    (keep_unused) so the executable can be called directly and restored from the cache. With a
    placement, the avals carry the inputs' shardings and XLA partitions the program (SPMD).
    `xla_options` (the option's pairs) are XLA's compile options for this program. `remote`: XLA
    compiles in the compiler process (compiler/worker.py). Returns (lowered, compiled, the
    executable's serialization where it came as bytes else None, lower seconds, compile seconds)."""
    avals = program.avals if placement is None else spmd.sharded_avals(program, placement, spec)
    t0 = time.perf_counter()
    with jax.enable_x64(True):
        # a forward's saved activations that XLA computes channels-minor come back so
        out_shardings = None if program.saved_layouts is None else (
            None, tuple(Format(Layout.AUTO) if chosen else None for chosen in program.saved_layouts), None)
        lowered = jax.jit(program.fn, keep_unused=True, out_shardings=out_shardings).trace(*avals).lower()
        t1 = time.perf_counter()
        heap.release_free_pages()  # what tracing freed leaves before XLA's compile peak (DECISIONS 95)
        blob = None
        try:
            if remote:
                compiled, blob = worker.compile(lowered, dict(xla_options) or None)
            else:
                compiled = lowered.compile(compiler_options=dict(xla_options) or None)
        except Exception as exc:
            if xla_options and "option" in str(exc):  # XLA's words: "No such compile option", "While setting option"
                raise ValueError(f"torchtpu: option xla_options={dict(xla_options)}: {exc}") from exc
            raise
        heap.release_free_pages()  # and what the compile freed
    return lowered, compiled, blob, t1 - t0, time.perf_counter() - t1
