"""torchtpu.export: the forward program(s) of a function or module as portable StableHLO,
exported for target platforms this machine need not have."""
from __future__ import annotations

import dataclasses

import jax
import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torchtpu import spmd
from torchtpu.compiler.decompositions import decomposition_table
from torchtpu.compiler.lower import to_jax_program
from torchtpu.compiler.spec import spec_of
from torchtpu.options import Options
from torchtpu.passes import run_passes
from torchtpu.runtime import target as targets


@dataclasses.dataclass
class ExportedPrograms:
    """The exported forward program(s), one per graph Dynamo produced (one with fullgraph=True)."""

    programs: list[jax.export.Exported]
    platforms: tuple[str, ...]

    def stablehlo_text(self) -> str:
        """The StableHLO MLIR text of every program, in graph order."""
        return "\n".join(p.mlir_module() for p in self.programs)

    def serialize(self) -> list[bytes]:
        """Versioned, portable artifacts (jax.export serialization; loadable by later jaxlibs)."""
        with jax.enable_x64(True):
            return [bytes(p.serialize()) for p in self.programs]


def export(fn_or_module, *example_args, platforms=("cpu", "tpu"), options: dict | None = None,
           **example_kwargs) -> ExportedPrograms:
    """Traces `fn_or_module(*example_args, **example_kwargs)` with Dynamo (fullgraph) and
    AOTAutograd and exports each forward graph as StableHLO for `platforms`.

    Args:
        fn_or_module: a torch function or nn.Module.
        example_args: inputs that fix shapes and dtypes.
        platforms: JAX platform names: "cpu", "tpu", "cuda", "rocm".
        options: backend options (as for torch.compile(..., options=...)).

    Returns:
        ExportedPrograms; `.stablehlo_text()` gives the MLIR text.
    """
    platforms = tuple(platforms)
    # An artifact runs in other processes: no custom call into this process's ATen kernels, and
    # no check flag (an extra output that only our runtime reads).
    opts = dataclasses.replace(Options.parse(options), aten_kernels="off", check_indices=False)
    # Kernels are chosen per target: one artifact for several platforms uses XLA's own ops.
    target = platforms[0] if len(platforms) == 1 else "portable"
    captured: list[jax.export.Exported] = []

    spmd_inputs = None

    def forward_compiler(gm, inputs):
        with unset_fake_temporarily():
            gm, spec = run_passes(gm, opts), spec_of(inputs)
            program = to_jax_program(gm, spec, target, opts)
            # with a mesh, the inputs' shardings go into the artifact (sdy.sharding per argument, nr_devices)
            placement = spmd.placement_for(gm, opts, spmd_inputs, targets.resolve(opts)[0])
            avals = program.avals if placement is None else spmd.sharded_avals(program, placement, spec)
            with jax.enable_x64(True):
                captured.append(jax.export.export(jax.jit(program.fn), platforms=platforms)(*avals))
        return make_boxed_func(gm.forward)

    def backend(gm, inputs):
        nonlocal spmd_inputs
        spmd_inputs = spmd.graph_inputs(gm, opts.tp_plan) if opts.mesh is not None else None
        return aot_module_simplified(gm, inputs, fw_compiler=forward_compiler,
                                     decompositions=decomposition_table())

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn_or_module, backend=backend, fullgraph=True, dynamic=False)(*example_args, **example_kwargs)
    torch._dynamo.reset()
    return ExportedPrograms(captured, platforms)
