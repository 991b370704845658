"""Registers the tpu device with torch: PrivateUse1 renamed "tpu", torch.tpu, hooks, kernels.

Two steps. The device (a few ms) is what `import torchtpu.device`, and through the
`torch.backends` entry point every `import torch`, runs. The kernels (≈500 torch.library
registrations, ≈50 ms) wait for torch's call of `torch.tpu._lazy_init`, which it makes before
the first tpu tensor is made or moved from Python (factories, `torch.tensor`, `.to`); an op
that reaches the key before that (through `torch.ops`, or on a tensor a precompiled program
made) finds the device's fallback, which registers them first.
"""
from __future__ import annotations

import threading

import torch
import torch._tensor_str
import torch.storage
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from torchtpu.device import autocast, kernels, module, storage

NAME = "tpu"
_device_registered = False
_kernels_registered = False
_kernels_lock = threading.Lock()  # two threads may make their first tpu tensor at once


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return module.is_available()

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register() -> None:
    """Makes device="tpu" work in this process, kernels included (idempotent)."""
    register_device()
    register_kernels()


def register_device() -> None:
    """The device without its kernels: the renamed key, torch.tpu, hooks, guard (idempotent)."""
    global _device_registered
    if _device_registered:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise RuntimeError(f"torchtpu.device: torch's PrivateUse1 backend is already {current!r} in this "
                           f"process; one process holds one PrivateUse1 backend")
    _setup_privateuseone_for_python_backend(NAME, backend_module=module, hook=_Hooks(), device_guard=_Guard())
    _print_on_host()
    _clone_storages()
    kernels.register_fallback(_kernels_just_registered)
    autocast.register_fallthrough()
    _device_registered = True


def register_kernels() -> None:
    """The device's kernels for the PrivateUse1 key (idempotent; torch.tpu._lazy_init calls it)."""
    global _kernels_registered
    with _kernels_lock:
        if not _kernels_registered:
            kernels.register()
            autocast.register()
            _kernels_registered = True


def _kernels_just_registered() -> bool:
    """Registers the kernels if they are not yet; True when this call did (the fallback's test)."""
    if _kernels_registered:
        return False
    register_kernels()
    return True


def _print_on_host() -> None:
    """torch prints xla/lazy/ipu/mtia tensors from a CPU copy; tpu tensors too. Formatting
    on the device would run a program per reduction and one `.item()` per element."""
    tensor_str = torch._tensor_str._tensor_str
    if getattr(tensor_str, "_torchtpu", False):
        return

    def _tensor_str(self, indent):
        if self.device.type == NAME:
            self = self.to("cpu")
        return tensor_str(self, indent)

    _tensor_str._torchtpu = True
    torch._tensor_str._tensor_str = _tensor_str


def _clone_storages() -> None:
    """torch clones a storage (copy.deepcopy of tensors and modules) by allocating one with the
    device's allocator, which a Python backend cannot register (torch would crash): a tpu
    storage's clone shares its immutable device array instead."""
    clone = torch.storage._StorageBase.clone
    if getattr(clone, "_torchtpu", False):
        return

    def _clone(self):
        if self.device.type == NAME:
            return storage.clone_storage(self)
        return clone(self)

    _clone._torchtpu = True
    torch.storage._StorageBase.clone = _clone
