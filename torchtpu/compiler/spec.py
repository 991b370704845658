"""Input signatures: what one executable is specialised to."""
from __future__ import annotations

import dataclasses

import torch

from torchtpu.compiler.dtypes import short_name


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        return f"{short_name(self.dtype)}[{','.join(map(str, self.shape))}]"


def spec_of(values) -> tuple:
    """The signature of concrete call arguments: TensorSpec per tensor, the value otherwise."""
    return tuple(
        TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for v in values
    )


def contiguous_stride(shape) -> tuple[int, ...]:
    """torch's row-major strides for `shape` (size-0 and size-1 dims count as 1)."""
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(stride))


def is_static(example_inputs) -> bool:
    """True when fake example inputs carry no symbolic sizes or values."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            if any(not isinstance(s, int) for s in x.shape):
                return False
        elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return False
    return True


def describe(spec: tuple) -> str:
    return "(" + ", ".join(str(s) for s in spec) + ")"
