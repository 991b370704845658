"""A program partitioned over a mesh: compile with input shardings, run, gather outputs.

The sharded path calls jax's `Compiled` object: it takes and returns global `jax.Array`s whose
shards live on the mesh's devices, which is what jax's own SPMD runtime (and jax.distributed
across processes) is built around.
"""
from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import torch

from torchtpu import events
from torchtpu.compiler import checks
from torchtpu.compiler.spec import TensorSpec
from torchtpu.runtime import transfer
from torchtpu.layout import ProgramLayout
from torchtpu.runtime.executable import NotRunnableHere, torch_outputs
from torchtpu.spmd.placement import Placement, gather, put_input

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE_OP = re.compile(r"=\s*\S+\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


class ShardedExecutable:
    """One signature of a graph, partitioned by XLA over `placement.mesh`.

    Args:
        compiled: `jax.jit(fn, keep_unused=True).trace(*sharded_avals).lower().compile()`.
        program: the JaxProgram (its layout says how torch arguments feed it).
        placement: the graph's Placement.
        spec: the signature the program was compiled for.
        runnable: False for a deviceless compile (a TPU topology without the TPU).
    """

    def __init__(self, compiled, program, placement: Placement, spec: tuple, runnable: bool = True):
        self.compiled = compiled
        self.layout = ProgramLayout.of(program)
        self.placement = placement
        self.shardings = [placement.sharding(i, spec[i])[0] for i in self.layout.tensor_inputs]
        self.is_param = [i < len(placement.params) and placement.params[i] is not None
                         for i in self.layout.tensor_inputs]
        self.runnable = runnable

    def run(self, args: list, resident: frozenset[int] = frozenset(), dense_from: int | None = None) -> list:
        """Runs on `args` (cleared). Parameters (named by the placement, or in `resident`: the
        positions AOTAutograd marks static) are placed once and stay resident."""
        if not self.runnable:
            raise NotRunnableHere("this sharded executable was compiled for a TPU topology without one attached")
        like = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        with jax.enable_x64(True):
            arrays = [put_input(args[i], sharding, is_param or i in resident)
                      for i, sharding, is_param in zip(self.layout.tensor_inputs, self.shardings, self.is_param)]
            if self.layout.uses_rng:
                key = jax.device_put(transfer.random_key(), self.placement.replicated())
                arrays.insert(0, key)
            results = self.compiled(*arrays)
            args.clear()
            if self.layout.checks:
                checks.raise_if_failed(self.layout.checks, int(results[-1]))
            return torch_outputs(self.layout, lambda i: gather(results[i], like), dense_from)  # x64: int64 stays int64

    def collectives(self) -> dict[str, int]:
        """How many of each collective XLA's partitioner put in the compiled program."""
        return count_collectives(self.compiled.as_text())


def sharded_executable(compiled, program, placement: Placement, spec: tuple, target, name: str) -> ShardedExecutable:
    """Wraps a partitioned compile and records what was chosen ("spmd" compile event: the mesh,
    each parameter's sharding and why, the collectives XLA inserted)."""
    exe = ShardedExecutable(compiled, program, placement, spec, runnable=target.runnable)
    events.record("spmd", graph=name, platform=target.platform, collectives=exe.collectives(),
                  **describe(placement, spec))
    return exe


def sharded_avals(program, placement: Placement, spec: tuple) -> list[jax.ShapeDtypeStruct]:
    """The program's avals with each input's sharding on the mesh (the PRNG key replicated)."""
    avals = list(program.avals)
    tensor_avals = avals[1:] if program.uses_rng else avals
    out = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placement.sharding(i, spec[i])[0])
           for i, a in zip(program.tensor_inputs, tensor_avals)]
    if program.uses_rng:
        out.insert(0, jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=placement.replicated()))
    return out


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Collective ops by kind in an optimized HLO module's text (async pairs count once)."""
    return dict(collections.Counter(m.group(1) for m in _COLLECTIVE_OP.finditer(hlo_text)))


def describe(placement: Placement, spec: tuple) -> dict:
    """The shardings chosen for one signature, for the compile-event record: parameters by
    name, other inputs by position."""
    params, data = {}, {}
    for i, s in enumerate(spec):
        if not isinstance(s, TensorSpec):
            continue
        sharding, why = placement.sharding(i, s)
        param = placement.params[i] if i < len(placement.params) else None
        entry = {"spec": list(sharding.spec), "why": why, "shape": list(s.shape)}  # ["tp", None]: dim 0 over tp
        if param is not None:
            params[param.name] = entry
        else:
            data[str(i)] = entry
    return {"mesh": dict(placement.mesh.shape), "params": params, "inputs": data}
