"""Device copies of parameters and buffers, made once and reused while the tensor is unchanged.

A resident copy is keyed by the tensor's identity and its placement (a device or a sharding),
and is valid while the tensor object is alive and its version counter (`tensor._version`,
bumped by every in-place op: optimizer steps, `load_state_dict`, `.copy_()`) and storage are
those seen when the copy was made. Anything else is a miss and a fresh `put`. A copy that is a
view of the tensor's own memory (the CPU's zero-copy arrays) follows in-place updates by itself
and ignores the version: a training step does not import every parameter again.

Mutations through `.data` (`p.data.copy_(...)`) do not bump the parameter's version counter;
PyTorch's autograd does not see them either. On the CPU that does not matter (the device copy
is a zero-copy view of the tensor's memory, unless its strides needed a dense copy first); on
an accelerator use `with torch.no_grad(): p.copy_(...)`, which every optimizer and
`load_state_dict` already do.
"""
from __future__ import annotations

import weakref
from typing import Callable, Hashable

import torch

_entries: dict[tuple[int, Hashable], tuple] = {}


def resident(t: torch.Tensor, placement: Hashable, put: Callable[[torch.Tensor], object],
             aliases: Callable[[object, torch.Tensor], bool] | None = None):
    """The device copy of `t` at `placement`, made by `put(t)` on a miss.

    Args:
        t: a parameter or buffer (any tensor that outlives calls).
        placement: hashable: the jax device, or a sharding.
        put: makes the device copy.
        aliases: `aliases(array, t)`: whether the array `put` made is a view of `t`'s own memory
            (the CPU). Such a view sees in-place updates by itself, so an optimizer step (a new
            version, same memory) keeps it; a new storage, shape, strides or dtype still do not.

    Returns:
        The device array, shared by all calls that see `t` unchanged.
    """
    key = (id(t), placement)
    entry = _entries.get(key)
    if entry is not None and entry[0]() is t and entry[1] == _state(t, entry[3]):
        return entry[2]
    array = put(t)
    versioned = aliases is None or not aliases(array, t)
    _entries[key] = (weakref.ref(t, lambda _ref, key=key: _forget(key, _ref)), _state(t, versioned), array, versioned)
    return array


def _state(t: torch.Tensor, versioned: bool) -> tuple:
    return (t._version if versioned else None, t.data_ptr(), t.shape, t.stride(), t.dtype)


def _forget(key, ref) -> None:
    entry = _entries.get(key)
    if entry is not None and entry[0] is ref:
        del _entries[key]


def clear() -> None:
    """Drops every resident copy (tests; freeing device memory)."""
    _entries.clear()


def size() -> int:
    return len(_entries)


def _entries_arrays() -> list:
    """The device arrays held now (tests)."""
    return [entry[2] for entry in _entries.values()]
