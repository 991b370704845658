"""How a compiled program's parameters and results map onto a graph's torch arguments and outputs.

Plain data shared by the compiler (which produces it), the runtime (which runs by it) and the
cache (which stores it beside each executable): it imports nothing of torchtpu.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class OutputSlot:
    """How one graph output is rebuilt as a torch value after the program ran."""

    kind: str  # "tensor" (index into the program's results), "value" (a Python value), "none"
    index: int = -1
    value: Any = None
    stride: tuple[int, ...] | None = None  # torch's stride when it is not the contiguous one



@dataclasses.dataclass
class ProgramLayout:
    """How torch arguments map onto the program's parameters and its results back onto outputs.

    Known only after tracing; the cache stores it next to the executable.
    """

    tensor_inputs: list[int]  # positions of tensor arguments, in parameter order
    uses_rng: bool  # a PRNG key is parameter 0
    outputs: list[OutputSlot]
    checks: list[dict] = dataclasses.field(default_factory=list)  # when any: the last result is their flag

    @classmethod
    def of(cls, program) -> "ProgramLayout":
        return cls(list(program.tensor_inputs), bool(program.uses_rng), list(program.outputs),
                   list(program.checks))


BOUNDARY = "torchtpu_boundary_layouts"  # where a graph's BoundaryLayouts is kept (gm.meta)


@dataclasses.dataclass(frozen=True)
class BoundaryLayouts:
    """Memory layouts at the boundary between a forward program and its backward, on the CPU.

    The activations a forward saves are read only by its backward. XLA computes many of them in
    another order than row-major (a channels-last convolution's result is NHWC; a linear layer's
    output seen as attention heads is [B, S, H, D] in memory), so a row-major result costs a
    transposing copy in the forward and often another back in the backward. With this, the
    forward lets XLA choose its saved results' layouts (torch sees strided tensors, through
    DLPack), and the backward takes those inputs in the same layouts (docs/DECISIONS.md 117).

    Args:
        saved_from: a forward's output position from which its results are saved activations
            (None: every result row-major).
        chosen: per saved tensor result, in order, whether XLA chooses its layout (one it is
            known to compute channels-minor); the others stay row-major.
        inputs: (argument position, major-to-minor dim order) of a backward's inputs that arrive
            in a non-row-major layout; the program is compiled to read them so.
    """

    saved_from: int | None = None
    chosen: tuple[bool, ...] = ()
    inputs: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __bool__(self) -> bool:
        return any(self.chosen) or bool(self.inputs)

    def key(self) -> str:
        return f"saved_from={self.saved_from} chosen={list(self.chosen)} inputs={list(self.inputs)}"
