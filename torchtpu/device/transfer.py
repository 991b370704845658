"""Host <-> device for tpu tensors: uploads, downloads, zeros, scalars and PRNG keys.

Built on runtime/transfer.py (the compiler's path): on the CPU platform both directions are
DLPack views, so an upload first copies the tensor (the device array must not see later host
writes) and a download is a read-only view of the device array (copied out by the caller).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torchtpu import counters
from torchtpu.runtime import platform, transfer

_ZEROS_KEPT = 64  # distinct (numel, dtype) zero arrays kept for empty storages (arrays are immutable)
_ZEROS_KEPT_BYTES = 1 << 20  # larger ones are made each time: a kept one would hold device memory
_SCALARS_KEPT = 4096
_zeros: dict = {}
_scalars: dict = {}


@functools.cache
def device() -> jax.Device:
    """The jax device tpu tensors live on (runtime/platform.py's choice: TPU, else GPU, else CPU)."""
    return platform.device()


def upload(t: torch.Tensor):
    """A host tensor's values as a new device array of its shape and dtype."""
    t = t.detach()
    if transfer.zero_copy(device()):
        t = t.clone(memory_format=torch.contiguous_format)  # the array views this memory: nobody else may write it
    counters.bump("eager_uploads")
    with jax.enable_x64(True):
        return transfer.to_device(t, device())


def download(array) -> torch.Tensor:
    """A device array as a host tensor (on the CPU platform a read-only view of it)."""
    counters.bump("eager_downloads")
    if device().platform == "cpu":
        return transfer.from_cpu_buffer(array)
    return transfer.to_torch(array)


def zeros(numel: int, dtype: torch.dtype):
    """A flat array of zeros (what torch.empty reads), shared by every small storage of that size."""
    if numel * dtype.itemsize > _ZEROS_KEPT_BYTES:
        return upload(torch.zeros(numel, dtype=dtype))
    key = (numel, dtype)
    array = _zeros.get(key)
    if array is None:
        if len(_zeros) >= _ZEROS_KEPT:
            _zeros.pop(next(iter(_zeros)))
        array = _zeros[key] = upload(torch.zeros(numel, dtype=dtype))
    return array


def scalar(value, dtype: torch.dtype):
    """A 0-d device array holding a Python number (a runtime input of a program), kept by value."""
    key = (dtype, value, math.copysign(1.0, value) if isinstance(value, float) else 0)
    array = _scalars.get(key)
    if array is None:
        if len(_scalars) >= _SCALARS_KEPT:
            _scalars.clear()
        array = _scalars[key] = upload(torch.tensor(value, dtype=dtype))
    return array


@functools.cache
def _bitcast_fn(source, target, ratio: int):
    source, target = np.dtype(source), np.dtype(target)

    def fn(a):
        a = a.reshape(-1)
        # XLA has no bitcast to or from complex types: a complex is its (real, imaginary) pair
        if source.kind == "c" and target.kind == "f" and target.itemsize * 2 == source.itemsize:
            return jnp.stack([jnp.real(a), jnp.imag(a)], axis=-1).reshape(-1).astype(target)
        if target.kind == "c" and source.kind == "f" and source.itemsize * 2 == target.itemsize:
            return jax.lax.complex(a[0::2], a[1::2]).astype(target)
        if source.kind == "c" or target.kind == "c":
            raise NotImplementedError(f"a {target} view of a {source} tpu storage")
        if ratio > 1:  # to a wider type: groups of `ratio` elements become one
            a = a.reshape(-1, ratio)
        out = jax.lax.bitcast_convert_type(a, target)
        return out.reshape(-1)

    return jax.jit(fn)


def bitcast(array, dtype: torch.dtype):
    """The array's bytes as a flat array of `dtype` (storage plumbing for dtype views, not an op)."""
    from torchtpu.compiler.dtypes import to_jax

    target = to_jax(dtype)
    source_size, target_size = array.dtype.itemsize, np.dtype(target).itemsize
    with jax.enable_x64(True):
        return _bitcast_fn(array.dtype, target, max(target_size // source_size, 1))(array)


@functools.cache
def _resize_fn():
    def fn(a, shape):  # each dim cut or zero-extended at its end (lax.pad takes negative padding)
        return jax.lax.pad(a, jnp.zeros((), a.dtype), [(0, n - m, 0) for m, n in zip(a.shape, shape)])

    return jax.jit(fn, static_argnums=1)


def resize(array, shape: tuple):
    """`array` with each dim cut to, or zero-extended to, `shape`'s (padded storages: their
    buckets and their exact contents). On the CPU platform through the host, with no program;
    elsewhere one small program per pair of shapes."""
    shape = tuple(shape)
    if tuple(array.shape) == shape:
        return array
    if device().platform == "cpu":
        host = download(array)
        out = torch.zeros(shape, dtype=host.dtype)
        common = tuple(slice(0, min(m, n)) for m, n in zip(host.shape, shape))
        out[common] = host[common]
        return upload(out)
    with jax.enable_x64(True):
        return _resize_fn()(array, shape)


def unpad(array, true: tuple):
    """A padded storage's exact array (the elements at the front of each dim)."""
    counters.bump("eager_unpads")
    return resize(array, true)


_SIZES_KEPT = 1024
_sizes: dict = {}


def sizes(values: tuple):
    """An int64 vector of a bucketed program's true sizes, kept by value."""
    array = _sizes.get(values)
    if array is None:
        if len(_sizes) >= _SIZES_KEPT:
            _sizes.clear()
        array = _sizes[values] = upload(torch.tensor(values, dtype=torch.int64))
    return array


def host_scalar(t: torch.Tensor):
    """A 0-d CPU tensor's current value as a 0-d device array (read at every call: it may change)."""
    return upload(t)


def random_key(generator: torch.Generator):
    """A PRNG key for one program, drawn from the device's torch generator (torch.tpu.manual_seed)."""
    bits = torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64, generator=generator)
    return jax.device_put(bits.numpy().astype(np.uint32), device())


def ready(arrays) -> None:
    for a in arrays:
        a.block_until_ready()


def to_host(t: torch.Tensor, reason: str = "download") -> torch.Tensor:
    """A tpu tensor's values on the host, with its size and strides. On the CPU platform a view
    of the device array's memory: read it, do not write it. `reason` names the read in the flush
    event of a pending storage (defer mode)."""
    from torchtpu.device.storage import storage_of

    s = storage_of(t)
    if s.padding is not None and s.exact is None:  # the padded array, sliced on the host
        padded = download(s.array)
        flat = padded[tuple(slice(0, n) for n in s.padding.true)].reshape(-1)
    else:
        array = s.value(reason)
        flat = torch.zeros(s.numel, dtype=s.dtype) if array is None else download(array).reshape(-1)
    if t.dtype != s.dtype:  # a view of another dtype (torch.save reads storages as bytes)
        flat = flat.view(t.dtype)
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


def _array_of(t: torch.Tensor, target: jax.Device):
    """A tpu tensor as a compiled graph's input: its storage's array when the tensor is all of
    it in that shape, else a copy of the tensor's values (one program)."""
    from torchtpu.device.storage import storage_of

    s = storage_of(t)
    if not (t.dtype == s.dtype and t.storage_offset() == 0 and t.is_contiguous() and s.shape == tuple(t.shape)):
        s = storage_of(t.clone(memory_format=torch.contiguous_format))
    array = s.value("compiled graph input") if s.array is not None else s.read()
    return array if target == device() else jax.device_put(array, target)


def _tensor_of(array) -> torch.Tensor:
    """A compiled graph's result as a tpu tensor over the array itself."""
    from torchtpu.compiler.dtypes import to_torch
    from torchtpu.device.storage import DeviceStorage, wrap

    if next(iter(array.devices())) != device():
        array = jax.device_put(array, device())
    dtype = to_torch(array.dtype)
    return wrap(DeviceStorage(math.prod(array.shape), dtype, array), tuple(array.shape), None, 0, dtype)


def _register_with_runtime() -> None:
    from torchtpu.device.storage import device_name

    transfer.register_device_tensors(device_name(), _array_of, _tensor_of)


_register_with_runtime()
