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
