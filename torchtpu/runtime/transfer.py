"""torch tensors <-> device buffers.

On the CPU both sides share memory through DLPack (zero copy). Elsewhere tensors travel
through the host. Results come back on the torch device the inputs were on.

The public `jax.dlpack.from_dlpack` costs ≈37 µs per tensor here (checks, a canonicalising
`jnp.asarray`, placement); the PJRT call underneath costs ≈7 µs. Back to torch, the public
path costs ≈10 µs and the capsule call ≈1 µs. The CPU path calls PJRT directly both ways, and
takes torch's capsule from `torch._C._to_dlpack` (0.5 µs) rather than `Tensor.__dlpack__`
(≈9 µs of Python argument handling whose checks `_dense` already made). See docs/DECISIONS.md.
"""
from __future__ import annotations

import jax
import numpy as np
import torch
from jax._src.lib import _jax

from torchtpu.compiler.spec import contiguous_stride

_KDLCPU = 1

# Torch device types whose tensors hold device arrays of their own (torchtpu.device registers
# "tpu" when its runtime starts): type -> (array_of(tensor, jax device), tensor_of(array)).
_DEVICE_TENSORS: dict = {}


def register_device_tensors(device_type: str, array_of, tensor_of) -> None:
    """Lets programs take tensors of `device_type` as their device arrays and give their results
    back as such tensors, with no host copy either way."""
    _DEVICE_TENSORS[device_type] = (array_of, tensor_of)


def holds_arrays(device: torch.device | None) -> bool:
    """Whether tensors on `device` hold their device arrays (residency has nothing to keep)."""
    return device is not None and device.type in _DEVICE_TENSORS


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A tensor whose strides are exactly row-major: PJRT executables take the default layout,
    and DLPack would otherwise carry torch's free strides of size-1 dims through."""
    shape = t.shape
    if (not t.requires_grad and t.is_contiguous() and 1 not in shape and 0 not in shape
            and not t.is_conj() and not t.is_neg()):
        return t  # the common case, checked cheaply
    if t.requires_grad:
        t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.stride() != contiguous_stride(t.shape):
        t = t.clone(memory_format=torch.contiguous_format)
        if t.stride() != contiguous_stride(t.shape):
            t = torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
    return t


def host_arrays(args: list, positions: list[int], device: jax.Device) -> list | None:
    """`to_device(args[i], device)` for each position, for a CPU `device`, in one call; None when
    one of those arguments is not a CPU tensor (to_device knows where the others go)."""
    arrays = []
    for i in positions:
        t = args[i]
        if not t.is_cpu:
            return None
        arrays.append(_jax.dlpack_managed_tensor_to_buffer(torch._C._to_dlpack(_dense(t)), device, None, None, _KDLCPU))
    return arrays


def zero_copy(device) -> bool:
    """Whether `to_device` makes a view of the tensor's memory rather than a copy."""
    return getattr(device, "platform", None) == "cpu"


def strides_in_order(shape, order) -> tuple[int, ...]:
    """The strides of a dense array of `shape` whose dims run `order`, major to minor."""
    strides, acc = [0] * len(shape), 1
    for dim in reversed(order):
        strides[dim] = acc
        acc *= max(int(shape[dim]), 1)
    return tuple(strides)


def in_order(t: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """`t` with the strides of a dense array whose dims run `order` major to minor, for a program
    that reads that layout (layout.BoundaryLayouts): a view when its memory is already so (the
    forward's saved result it usually is), else a copy. Strides must match exactly: PJRT does not
    check a buffer's layout against the program's, and would read the memory in the wrong order."""
    strides = strides_in_order(t.shape, order)
    if t.requires_grad:
        t = t.detach()
    if not t.is_conj() and not t.is_neg() and all(
            have == want for have, want, size in zip(t.stride(), strides, t.shape) if size > 1):
        return t if t.stride() == strides else t.as_strided(t.shape, strides, t.storage_offset())
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def to_device(t: torch.Tensor, device: jax.Device, order: tuple[int, ...] | None = None):
    """`t` as an array on `device`: row-major, or in `order` (major to minor) where the program
    reads that layout."""
    t = _dense(t) if order is None else in_order(t, order)
    if t.is_cpu and device.platform == "cpu":  # a view of the tensor's memory
        return _jax.dlpack_managed_tensor_to_buffer(torch._C._to_dlpack(t), device, None, None, _KDLCPU)
    own = _DEVICE_TENSORS.get(t.device.type)
    if own is not None:
        return own[0](t, device)
    return copy_to(t, device)


def aliases(array, t: torch.Tensor) -> bool:
    """Whether the CPU array `to_device` made is a view of `t`'s own memory (no dense copy)."""
    return array.unsafe_buffer_pointer() == t.data_ptr()


def copy_to(t: torch.Tensor, device: jax.Device):
    """A copy of `t` on `device` (another platform's, or another device type's tensor). Under
    x64, as programs are lowered: without it JAX narrows int64 to int32, and a TPU program
    refused its int64 token ids."""
    with jax.enable_x64(True):
        if t.device.type == "cuda" and device.platform == "gpu":
            return jax.dlpack.from_dlpack(t)
        return jax.device_put(jax.dlpack.from_dlpack(t.cpu()), device)


def from_cpu_buffer(array) -> torch.Tensor:
    """A CPU device buffer as a torch tensor, zero copy: the PJRT call under
    `torch.from_dlpack(array)`, ≈1 µs vs ≈10."""
    return torch._C._from_dlpack(_jax.buffer_to_dlpack_managed_tensor(array, stream=None))


def to_torch(array, like_device: torch.device | None = None) -> torch.Tensor:
    own = _DEVICE_TENSORS.get(like_device.type) if like_device is not None else None
    if own is not None:
        return own[1](array)
    platform = next(iter(array.devices())).platform
    if platform == "cpu":
        out = from_cpu_buffer(array)
        return out if like_device is None or like_device.type == "cpu" else out.to(like_device)
    if platform != "gpu":
        array = jax.device_put(array, jax.devices("cpu")[0])
    out = torch.from_dlpack(array)
    if like_device is not None and out.device != like_device:
        out = out.to(like_device)
    return out


def scalar(array) -> int:
    """A 0-d integer device buffer's value on the host: waits for the program that computes it.
    (On the CPU as fast as the DLPack path here, ≈4 µs, and the same on every platform.)"""
    return int(np.asarray(array))


def random_key() -> np.ndarray:
    """A fresh PRNG key drawn from torch's default generator (so torch.manual_seed applies)."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64).numpy().astype(np.uint32)
