"""The callable handed back to AOTAutograd: marshal, execute, rebuild torch outputs."""
from __future__ import annotations

from typing import Callable

import jax
import torch

from torchtpu.compiler.spec import spec_of
from torchtpu.runtime import transfer


class CompiledGraph:
    """Runs one FX graph; compiles one executable per input signature on demand.

    Args:
        build: signature -> Executable (the driver's pipeline for one signature).
        name: the graph's name in logs and dumps.
    """

    _boxed_call = True  # AOTAutograd hands us the argument list and lets us clear it

    def __init__(self, build: Callable, name: str):
        self._build = build
        self.name = name
        self._executables: dict[tuple, "Executable"] = {}

    def executable_for(self, spec: tuple) -> "Executable":
        exe = self._executables.get(spec)
        if exe is None:
            exe = self._executables[spec] = self._build(spec)
        return exe

    def __call__(self, args: list):
        exe = self.executable_for(spec_of(args))
        return exe.run(args)


class Executable:
    """A compiled program for one signature plus how to rebuild its outputs."""

    def __init__(self, compiled, program, device: jax.Device):
        self.compiled = compiled
        self.program = program
        self.device = device

    def run(self, args: list) -> list:
        program = self.program
        like = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        with jax.enable_x64(True):
            arrays = [transfer.to_device(args[i], self.device) for i in program.tensor_inputs]
            if program.uses_rng:
                arrays.insert(0, jax.device_put(transfer.random_key(), self.device))
            results = self.compiled(*arrays)
        args.clear()
        out = []
        for slot in program.outputs:
            if slot.kind == "tensor":
                t = transfer.to_torch(results[slot.index], like)
                if slot.stride is not None:
                    t = torch.empty_strided(t.shape, slot.stride, dtype=t.dtype, device=t.device).copy_(t)
                out.append(t)
            elif slot.kind == "value":
                out.append(slot.value)
            else:
                out.append(None)
        return out
