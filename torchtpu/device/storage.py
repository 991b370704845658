"""Storages of tpu tensors: one flat device array per torch storage, torch's views on top.

A tpu tensor is a real PrivateUse1 tensor: torch keeps its size, stride, storage offset, view
relations and version counter. Its torch storage holds no memory; it carries a DeviceStorage
(`untyped_storage()._tpu`) whose `array` is a jax.Array of the storage's elements in memory
order, in the shape of the tensor that wrote it (so a compiled graph can take it as it is).
Every view of a storage reads that array through its own size/stride/offset, and a write
replaces the array, so all views and the base see it.

Each storage gets its own address range in a space no process memory uses (above 2**48, not
canonical on x86-64 and arm64): `data_ptr()` tells storages apart and orders views inside one,
as torch's aliasing checks expect, and a stray host read faults instead of reading garbage.

A storage whose size varies from call to call (a growing KV cache, generate()'s token list) may
hold its array padded (`padding`): each of its dims at the front of the array's dim, the array's
dims those of a size bucket (device/bucketed.py). Only the per-op programs of bucketed.py read
such an array as it is; every other reader gets the exact array (`value`), sliced once and kept.

JAX is imported on the first transfer or program, never by making an empty tensor.
"""
from __future__ import annotations

import functools
import threading
import typing

import torch

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)  # torch's metadata-only view kernels
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_set_storage_cpu = _set_storage._handle.redispatch_boxed  # OpOverload.redispatch without its Python frame
_from_pointer = torch._C._construct_storage_from_data_pointer
_create_empty = torch._C._acc.create_empty_tensor
_ALIGN = 64
# Plain Lock: the locked sections drop no references and allocate no containers, so no __del__
# (nor a collection) can run inside one on the thread that holds it.
_lock = threading.Lock()
_memory = {"allocated": 0, "peak": 0, "next_address": 1 << 48}  # addresses are never reused


def device_name() -> str:
    return torch._C._get_privateuse1_backend_name()


@functools.cache
def torch_device() -> torch.device:
    """The torch.device of tpu:0, made once (the backend's name is set once, at registration)."""
    return torch.device(device_name(), 0)


class Padded(typing.NamedTuple):
    """How a padded storage's array holds its elements: row-major over `true`, each dim at the
    front of the array's dim of the same index (the array's other positions hold anything)."""

    true: tuple  # the storage's dims (their product is its numel)
    dynamic: tuple  # per dim: its size varies between calls (the array's dim is its bucket)


class DeviceStorage:
    """The device memory of one torch storage.

    Attributes:
        array: a jax.Array of `numel` elements of `dtype` in memory order, or None while
            nothing was written (torch.empty): readers then see zeros. Written through `set`;
            with `padding`, the array of a size bucket holding them (`set_padded`).
        shape: the array's shape ((numel,) while there is none); with `padding`, its true dims.
        numel: elements of `dtype` the storage holds.
        dtype: the dtype of the tensor the storage was made for (retype reinterprets it).
        padding: None, or the Padded layout of `array`.
        exact: with `padding`, the exact array once a reader needed it (else None).
        origin: the op and call site whose program made it, as bucketed.Growth numbers them
            (None: anything else), so a size that grows around a loop is recognised.
    """

    __slots__ = ("array", "shape", "numel", "dtype", "nbytes", "address", "padding", "exact", "origin")

    def __init__(self, numel: int, dtype: torch.dtype, array=None, padding: Padded | None = None):
        self.array = array
        self.padding = padding
        self.exact = None
        self.origin = None
        self.shape = padding.true if padding is not None else (numel,) if array is None else tuple(array.shape)
        self.numel = numel
        self.dtype = dtype
        self.nbytes = nbytes = numel * dtype.itemsize
        self.address = _account(nbytes)

    def __del__(self):
        _release(self.nbytes)

    def value(self, reason: str = "read"):
        """The current array, or None while nothing was written. Every read of a storage's
        contents goes through here: a storage defer mode left pending runs its graph (`reason`
        names the read in the flush's event)."""
        array = self.array
        if array.__class__ is Pending:
            array = self.array = array.get(reason)
        if self.padding is not None:
            return self.exact if self.exact is not None else self._unpad()
        return array

    def _unpad(self):
        from torchtpu.device import transfer

        self.exact = transfer.unpad(self.array, self.padding.true)
        return self.exact

    def take(self, other: "DeviceStorage") -> None:
        """`other`'s contents, as it holds them (arrays are immutable, so both storages may hold
        one; a pending one runs its graph when either is read)."""
        if other.array is None:
            other.read()
        self.array, self.shape, self.padding, self.exact = other.array, other.shape, other.padding, other.exact

    def set(self, array) -> None:
        """The storage's new contents (any shape of `numel` elements, in memory order)."""
        self.array, self.shape, self.padding, self.exact = array, tuple(array.shape), None, None

    def set_padded(self, array, padding: Padded) -> None:
        """New contents as a padded array (see Padded)."""
        self.array, self.shape, self.padding, self.exact = array, padding.true, padding, None

    def read(self):
        """The array, materialising zeros for a storage nothing has written."""
        array = self.value()
        if array is None:
            from torchtpu.device import transfer

            array = transfer.zeros(self.numel, self.dtype)
            self.set(array)
        return array

    def retype(self, dtype: torch.dtype) -> None:
        """Reinterprets the storage's bytes as `dtype` (a program reads a tensor of another dtype
        than the one the storage was made for: Tensor.view(dtype), torch.load's byte copies)."""
        if self.nbytes % dtype.itemsize:
            raise NotImplementedError(f"a {dtype} view of a {self.nbytes}-byte tpu storage")
        array = self.value()
        self.dtype, self.numel = dtype, self.nbytes // dtype.itemsize
        if array is None:
            self.shape = (self.numel,)
        else:
            from torchtpu.device import transfer

            self.set(transfer.bitcast(array, dtype))

    def copy(self) -> "DeviceStorage":
        """A storage with the same contents: arrays are immutable, so they can be shared."""
        copy = DeviceStorage(self.numel, self.dtype)
        if self.array is not None:
            copy.take(self)
        return copy


class Pending:
    """The array of a storage a deferred op wrote (defer mode: torchtpu/device/defer.py): filled
    when the pending graph that computes it runs. Storages hold it in place of the array."""

    __slots__ = ("shape", "array", "graph", "index", "__weakref__")

    def __init__(self, shape: tuple, graph, index: int):
        self.shape, self.array, self.graph, self.index = shape, None, graph, index

    def get(self, reason: str):
        if self.array is None:
            self.graph.flush(reason)
        if self.graph.unverified():  # its program's checks, read before its value
            self.graph.verify()
        if self.array is None:  # its graph failed
            raise RuntimeError(f"torchtpu.device: this tensor's value was never computed: the deferred "
                               f"graph that writes it failed ({self.graph.error})") from self.graph.error
        return self.array


def _python_account(nbytes: int) -> int:
    """Counts `nbytes` as allocated; returns the new storage's address."""
    memory = _memory
    with _lock:
        address = memory["next_address"]
        memory["next_address"] = address + (nbytes // _ALIGN + 1) * _ALIGN
        allocated = memory["allocated"] = memory["allocated"] + nbytes
        if allocated > memory["peak"]:
            memory["peak"] = allocated
    return address


def _python_release(nbytes: int) -> None:
    with _lock:
        _memory["allocated"] -= nbytes


def _python_memory() -> tuple:
    """(allocated, peak, next address)."""
    return _memory["allocated"], _memory["peak"], _memory["next_address"]


def _python_reset_peak() -> None:
    with _lock:
        _memory["peak"] = _memory["allocated"]


# native.cc's atomic twins once the library loads (no lock: a storage is made per op result)
_account, _release, _memory_now, reset_peak = _python_account, _python_release, _python_memory, _python_reset_peak


def use_native_accounting(extension) -> None:
    """The library's counters from now on, starting where Python's stand."""
    global _account, _release, _memory_now, reset_peak
    with _lock:
        extension.start_accounting(*_python_memory())
        _account, _release, _memory_now, reset_peak = (extension.account, extension.release, extension.memory,
                                                       extension.reset_peak)


def memory_allocated() -> int:
    return _memory_now()[0]


def max_memory_allocated() -> int:
    return _memory_now()[1]


def storage_numel(size, stride) -> int:
    """Elements a strided tensor spans (torch's computeStorageNbytes, in elements)."""
    if any(s == 0 for s in size):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(size, stride))


def contiguous_stride(size) -> list[int]:
    """Row-major strides (a dim of 0 counts as 1). A symbolic size (bucketed.py: always >= 2) is
    multiplied in as it is, so a trace does not fix it."""
    stride, acc = [], 1
    for n in reversed(size):
        stride.append(acc)
        acc = acc * (n if isinstance(n, torch.SymInt) else max(n, 1))
    return stride[::-1]


def _python_torch_storage(storage: DeviceStorage) -> torch.UntypedStorage:
    """A torch storage for `storage` (one per DeviceStorage: views share it through torch)."""
    untyped = _from_pointer(storage.address, torch_device(), storage.nbytes)
    untyped._tpu = storage
    return untyped


def wrap(storage: DeviceStorage, size, stride=None, offset: int = 0, dtype=None) -> torch.Tensor:
    """A new tpu tensor over `storage` with torch's size/stride/offset (sequences of ints)."""
    if stride is None:
        stride = contiguous_stride(size)
    return _make_tensor(torch_storage(storage), size, stride, offset, dtype or storage.dtype)


def _python_make_tensor(untyped: torch.UntypedStorage, size, stride, offset: int, dtype) -> torch.Tensor:
    """An empty tpu tensor, then torch's CPU set_ (metadata and its bounds check only)."""
    t = _create_empty(size, dtype)
    _set_storage_cpu(_CPU, t, untyped, offset, size, stride)
    return t


# native.cc's twins once the library loads (the same storage, the same tensor)
torch_storage, _make_tensor = _python_torch_storage, _python_make_tensor


def use_native_makers(extension) -> None:
    """wrap's storage and tensor makers from now on (device/native.py: the C++ ones)."""
    global torch_storage, _make_tensor
    extension.set_storage_maker(_from_pointer, torch_device())
    torch_storage, _make_tensor = extension.torch_storage, extension.make_tensor


def point(t: torch.Tensor, storage: DeviceStorage, size, stride=None, offset: int = 0) -> torch.Tensor:
    """Makes `t` a view of `storage` (an out= tensor torch asked us to resize and fill)."""
    size = [int(s) for s in size]
    stride = contiguous_stride(size) if stride is None else [int(s) for s in stride]
    _set_storage_cpu(_CPU, t, torch_storage(storage), offset, size, stride)
    return t


def empty(size, stride=None, dtype=None) -> torch.Tensor:
    """torch.empty / empty_strided on the device: the storage is written before it is read."""
    dtype = dtype or torch.get_default_dtype()
    size = [int(s) for s in size]
    stride = contiguous_stride(size) if stride is None else [int(s) for s in stride]
    return wrap(DeviceStorage(storage_numel(size, stride), dtype), size, stride, 0, dtype)


def clone_storage(untyped: torch.UntypedStorage) -> torch.UntypedStorage:
    """UntypedStorage.clone for a tpu storage (torch's allocates with the device's allocator,
    which a Python backend cannot register)."""
    return torch_storage(untyped._tpu.copy())


def storage_of(t: torch.Tensor) -> DeviceStorage:
    storage = getattr(t.untyped_storage(), "_tpu", None)
    if storage is None:
        raise RuntimeError(f"a {t.device} tensor without device memory (was it made outside torchtpu.device?)")
    return storage


def set_storage(t: torch.Tensor, untyped: torch.UntypedStorage, offset: int, size, stride) -> torch.Tensor:
    """aten::set_ with a storage: checks it is ours, then torch's own metadata update."""
    if getattr(untyped, "_tpu", None) is None:
        raise RuntimeError(f"set_: the storage is on {untyped.device}, not a {device_name()} storage of torchtpu")
    return _set_storage_cpu(_CPU, t, untyped, offset, list(size), list(stride))


def metadata_view(op):
    """A view op's kernel: torch's CPU kernel, which only computes size/stride/offset over the
    same storage (no data is touched)."""

    redispatch = op._handle.redispatch_boxed

    def kernel(*args, **kwargs):
        return redispatch(_CPU, *args, **kwargs)

    kernel.__name__ = f"view[{op}]"
    return kernel
