"""The tpu device's kernels, registered with torch.library for the PrivateUse1 key.

Three kinds:
  - memory and metadata: empty, empty_strided, set_, resize_ and the view ops whose CPU kernels
    only compute size/stride/offset (as_strided, view, _reshape_alias, unfold); torch's
    composite view ops (t, transpose, slice, select, expand, permute, ...) reduce to these;
  - transfers: _copy_from (host <-> device, and device copies), _local_scalar_dense (.item());
  - everything else: one program per op signature (strict.py), through the fallback for the
    PrivateUse1 key, and directly for the ops torch would otherwise run as several kernel
    calls: factories (empty + an in-place fill: randn, zeros, full, arange, ...) and the
    structured ops (empty + resize_ + the out= variant: add, mul, mm, ... ~440 overloads).

Nothing here imports JAX: the runtime starts with the first transfer or program.
"""
from __future__ import annotations

import functools

import torch

from torchtpu.device import storage
from torchtpu.device.storage import DeviceStorage, contiguous_stride, storage_numel

aten = torch.ops.aten
KEY = "PrivateUse1"
VIEWS = (aten.as_strided.default, aten.view.default, aten._reshape_alias.default, aten.unfold.default,
         aten.view_as_real.default, aten.view_as_complex.default)  # the last two: a storage read as another dtype
# Run as one program each rather than torch's composite: factories (else empty + an in-place
# fill), index_put (else _index_put_impl_, which has no functional form with a rule),
# convolutions (else convolution_overrideable, a backend's own kernel), cummax/cummin (else
# _cummax_helper, which writes its outputs and has no functional form), native_group_norm (else
# torch's math composite, which views a channels-last input as if it were contiguous and fails),
# slice_backward and select_backward (else zeros + a copy_ into a view of them: two ops, for
# every backward of `x[..., :k]` or `x[i]`; rotary embeddings take 16 a step in a 2-layer Llama).
DIRECT = (aten.convolution.default, aten.convolution_backward.default, aten.cummax.default,
          aten.cummin.default, aten.randn.default, aten.rand.default, aten.randint.default, aten.randint.low,
          aten.randperm.default, aten.zeros.default, aten.ones.default, aten.full.default,
          aten.arange.default, aten.arange.start, aten.arange.start_step, aten.scalar_tensor.default,
          aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
          aten.rand_like.default, aten.randn_like.default, aten.index_put_.default, aten.index_put.default,
          aten.native_group_norm.default, aten.slice_backward.default, aten.select_backward.default)
# torch's optimizers' foreach ops (Adam, AdamW, SGD, ...): one program (strict) or one recorded
# step (defer) over the whole list, where torch's slow path for a backend would run one op per
# tensor. graph.py decomposes each into its per-tensor ops while tracing.
_FOREACH_BASES = ("add", "sub", "mul", "div", "lerp", "addcmul", "addcdiv", "sqrt", "neg", "pow", "maximum",
                  "minimum", "reciprocal", "clamp_min", "clamp_max", "sign", "exp", "zero", "copy")


def foreach_ops() -> list:
    """The `_foreach_*` overloads the device runs directly (not the out= ones, nor addcmul's and
    addcdiv's .Tensor, whose per-list values come as a 1-d tensor)."""
    ops = []
    for base in _FOREACH_BASES:
        for name in (f"_foreach_{base}", f"_foreach_{base}_"):
            packet = getattr(aten, name)
            for overload in packet.overloads():
                if overload.endswith("out") or (base in ("addcmul", "addcdiv") and overload == "Tensor"):
                    continue
                if base in ("maximum", "minimum") and overload != "List":
                    continue
                ops.append(getattr(packet, overload))
    return ops


_libraries: list = []  # torch.library registrations live as long as their Library objects


def register() -> None:
    from torchtpu.device import native

    lib = torch.library.Library("aten", "IMPL")
    if not native.load():  # else native.cc registers the view kernels (and the device guard)
        for op in VIEWS:
            lib.impl(op, storage.metadata_view(op), KEY)
    for op in DIRECT + tuple(foreach_ops()):
        lib.impl(op, _through_library(_Kernel(str(op), op)), KEY)
    for name in _structured():
        lib.impl(name, _through_library(_Kernel(name)), KEY)
    for name, kernel in [("empty.memory_format", _empty), ("empty_strided", _empty_strided),
                         ("set_.source_Storage_storage_offset", _set_storage),
                         ("set_.source_Storage", _set_whole_storage), ("set_.source_Tensor", _set_tensor),
                         ("set_", _set_empty), ("resize_", _resize),
                         ("_copy_from", _copy_from), ("_copy_from_and_resize", _copy_from_and_resize),
                         ("_local_scalar_dense", _item), ("_conj", _conj), ("_neg_view", _neg_view)]:
        lib.impl(name, kernel, KEY)
    _register_attention(lib)
    _libraries.append(lib)


def _register_attention(lib) -> None:
    """Fused attention, where native.cc's stub can send torch there (else torch's math path)."""
    from torchtpu.device import attention, native

    if native.loaded():
        lib.impl("_scaled_dot_product_fused_attention_overrideable", functools.partial(attention.forward, _run), KEY)
        lib.impl("_scaled_dot_product_fused_attention_overrideable_backward",
                 functools.partial(attention.backward, _run), KEY)


def register_fallback(ensure_kernels) -> None:
    """The fallback for the PrivateUse1 key, registered with the device (before the kernels):
    an op that reaches the key before torch called torch.tpu._lazy_init (`torch.ops.aten.zeros(...,
    device="tpu")`, or an op on a tensor a precompiled program made) first registers the kernels
    through `ensure_kernels`, then runs again from the top if it now has a kernel of its own."""
    def fallback(op, *args, **kwargs):
        known = _run_known
        if known is not None:  # defer mode's record of an op it knows, in C++ (native.cc)
            out = known(op, args, kwargs)
            if out is not _declined:
                return out
        # _strict is set by the first op run, which the kernels' registration always precedes
        if _strict is None and ensure_kernels() and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), KEY):
            return op(*args, **kwargs)
        return (_strict or _executor()).run(op, args, kwargs)

    lib = torch.library.Library("_", "IMPL")
    lib.fallback(fallback, KEY)
    _libraries.append(lib)


def _run(op, *args, **kwargs):
    return _executor().run(op, args, kwargs)


def _executor():
    """The module that runs ops (strict.py), imported at the first op: it loads JAX and the compiler."""
    global _strict
    if _strict is None:
        from torchtpu.device import strict as _strict
    return _strict


_strict = None


def _structured() -> list[str]:
    """The overloads whose kernel for this key would be torch's CompositeExplicitAutograd-
    NonFunctional one (a structured op's functional or in-place form run through its out= form)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return [name[len("aten::"):] for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and has(name, "CompositeExplicitAutogradNonFunctional")
            and not has(name, KEY) and name not in _METADATA_ONLY]


_METADATA_ONLY = {"aten::as_strided_"}  # torch's composite only sets size/stride/offset: keep it


class _Kernel:
    """The kernel of one overload (a structured op's, a DIRECT or a foreach one); a structured
    op's OpOverload is looked up at its first call (resolving ~440 of them at import would cost
    more than registering them)."""

    __slots__ = ("name", "op")

    def __init__(self, name: str, op=None):
        self.name, self.op = name, op

    def __call__(self, *args, **kwargs):
        if self.op is None:
            self.op = overload_named(self.name)
        return (_strict or _executor()).run(self.op, args, kwargs)


def _through_library(kernel: _Kernel):
    """`kernel` as torch calls it: through native.cc's run_kernel where the library loaded (defer
    mode records a known op there, without a Python frame), else as it is."""
    from torchtpu.device import native

    extension = native.module()
    return kernel if extension is None else functools.partial(extension.run_kernel, kernel)


_run_known = None  # native.cc's run_known, once defer mode gave it its state (defer.use_native)
_declined = None


def overload_named(name: str):
    """The aten OpOverload a registration name ("add.Tensor", "mm") stands for."""
    base, _, overload = name.partition(".")
    return getattr(getattr(aten, base), overload or "default")


# --- memory and metadata -----------------------------------------------------------------------


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = torch.empty(size, memory_format=memory_format, device="meta").stride()
        return storage.empty(size, stride, dtype)
    return storage.empty(size, None, dtype)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return storage.empty(size, stride, dtype)


def _set_storage(self, source, storage_offset=0, size=(), stride=()):
    stride = list(stride) if len(stride) else contiguous_stride(size)
    return storage.set_storage(self, source, storage_offset, size, stride)


def _set_whole_storage(self, source):
    n = source.nbytes() // self.dtype.itemsize
    return storage.set_storage(self, source, 0, [n], [1])


def _set_tensor(self, source):
    return storage.set_storage(self, source.untyped_storage(), source.storage_offset(), source.shape,
                               source.stride())


def _set_empty(self):
    return storage.point(self, DeviceStorage(0, self.dtype), [0])


def _resize(self, size, memory_format=None):
    size = [int(s) for s in size]
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        stride = contiguous_stride(size)
    else:
        stride = list(torch.empty(size, memory_format=memory_format, device="meta").stride())
    offset, old = self.storage_offset(), storage.storage_of(self)
    needed = offset + storage_numel(size, stride)
    if needed <= old.numel:
        return storage.set_storage(self, self.untyped_storage(), offset, size, stride)
    new = DeviceStorage(needed, old.dtype)
    if old.value() is not None and old.numel:  # torch keeps the old elements: rare, through the host
        from torchtpu.device import transfer

        kept = transfer.download(old.value()).reshape(-1)
        new.set(transfer.upload(torch.cat([kept, torch.zeros(needed - old.numel, dtype=old.dtype)])))
    return storage.point(self, new, size, stride, offset)


def _conj(self):
    """conj() of a complex tensor: the conjugate values, not a view with torch's conjugate bit.
    torch's C++ resolves that bit for backends it knows by reading memory; for ours it crashed."""
    return _executor().run(aten._conj_physical.default, (self,), {})


def _neg_view(self):
    """The negative bit's view (torch makes one for conj of imaginary parts): the negated values."""
    return _executor().run(aten.neg.default, (self,), {})


# --- transfers ---------------------------------------------------------------------------------


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == storage.device_name()


def _whole(t: torch.Tensor, s: DeviceStorage) -> bool:
    """Whether `t` is all of its storage, in order (a write to it is the storage's new value)."""
    return t.dtype == s.dtype and t.storage_offset() == 0 and t.numel() == s.numel and t.is_contiguous()


def _copy_from(src, dst, non_blocking=False):
    from torchtpu.device import transfer

    strict = _executor()
    if _on_device(src) and _on_device(dst):
        target = storage.storage_of(dst)
        if not (_whole(dst, target) and src.shape == dst.shape):
            strict.run(aten.copy_.default, (dst, src), {})
        elif _whole(src, storage.storage_of(src)) and src.dtype == dst.dtype:
            target.take(storage.storage_of(src))  # clone(): arrays are immutable, share it
        else:  # a program of the values alone: the old contents of dst are not read
            values = strict.run(aten._to_copy.default, (src,), {"dtype": dst.dtype,
                                                                "memory_format": torch.contiguous_format})
            target.take(storage.storage_of(values))
    elif _on_device(dst):
        src = src.detach().cpu()
        target = storage.storage_of(dst)
        if _whole(dst, target) and src.shape == dst.shape:  # the upload is the storage's new value
            target.set(transfer.upload(src.to(dst.dtype)))
        else:  # a part of the storage, a broadcast or a cast: a device copy_ from the uploaded values
            values = storage.wrap(DeviceStorage(src.numel(), src.dtype, transfer.upload(src)), src.shape)
            strict.run(aten.copy_.default, (dst, values), {})
    else:
        dst.copy_(transfer.to_host(src))
    return dst


def _copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return _copy_from(src, dst)


def _item(t):
    from torchtpu.device import transfer

    return transfer.to_host(t, "item").item()
