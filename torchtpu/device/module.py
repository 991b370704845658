"""torch.tpu: the device module torch finds for device type "tpu" (the shape of torch.cuda).

Light to import (no JAX): what torch and transformers ask at import or device selection
(is_available, device_count, current_device, manual_seed_all) is answered without starting
the runtime. Questions about the hardware (name, properties, free memory) start it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import importlib.util
import os
import sys

import torch

from torchtpu.device import storage

_DEFAULT_SEED = 67280421310721  # torch.cuda's default generator seed
_AVAILABLE_ENV = "TORCHTPU_DEVICE_AVAILABLE"
_TPU_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*")
_generator: torch.Generator | None = None


def generator() -> torch.Generator:
    """The host generator the device's random ops draw their PRNG keys from."""
    global _generator
    if _generator is None:
        _generator = torch.Generator()
        _generator.manual_seed(_DEFAULT_SEED)
    return _generator


# --- availability --------------------------------------------------------------------------


def is_available() -> bool:
    """Whether a real TPU runs this device's programs.

    tpu tensors work everywhere (a GPU or the CPU runs the same programs through XLA), but
    `torch.accelerator.is_available()` and therefore transformers' Trainer and accelerate take
    this answer to move training onto the device by default: with no TPU attached it is False,
    so installing torchtpu never moves a CPU user's job onto an emulated device.
    TORCHTPU_DEVICE_AVAILABLE=1 (or 0) overrides it. See docs/device.md.
    """
    forced = os.environ.get(_AVAILABLE_ENV, "").strip().lower()
    if forced in ("1", "true", "yes"):
        return True
    if forced in ("0", "false", "no"):
        return False
    return platform_name(start=False) == "tpu"


def platform_name(start: bool = True) -> str | None:
    """"tpu", "gpu" or "cpu": the PJRT platform that runs the device's programs. With
    start=False and the runtime not started yet, a probe that imports nothing: "tpu" when TPU
    device files and libtpu are present (or TORCHTPU_PLATFORM=tpu), else None."""
    runtime = sys.modules.get("torchtpu.device.transfer")
    if start or (runtime is not None and runtime.device.cache_info().currsize):
        from torchtpu.device import transfer

        return transfer.device().platform
    if os.environ.get("TORCHTPU_PLATFORM", "").strip().lower() == "tpu":
        return "tpu"
    return "tpu" if _tpu_attached() else None


@functools.cache
def _tpu_attached() -> bool:
    """TPU device files and libtpu present: probed once per process. torch's optimizers ask
    `torch.accelerator.current_accelerator()` on every step, which lands here, in every torch
    process where torchtpu is installed; the probe's glob and import lookup made each
    `AdamW.step()` about 70 µs slower (docs/DECISIONS.md 108)."""
    return any(glob.glob(p) for p in _TPU_FILES) and importlib.util.find_spec("libtpu") is not None


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """torch calls this before it makes or moves the first tpu tensor from Python: the kernels
    register here, not at import (every `import torch` would pay their ≈50 ms)."""
    from torchtpu.device import registration

    registration.register_kernels()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """1: one device, wherever tpu tensors can be made (also without a TPU: see is_available)."""
    return 1


def current_device() -> int:
    return 0


def _index(device) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != storage.device_name():
            raise ValueError(f"expected a {storage.device_name()} device, got {device}")
        index = device.index or 0
    if index != 0:
        raise RuntimeError(f"{storage.device_name()}:{index}: invalid device index (device_count() is 1)")
    return index


def set_device(device) -> None:
    _index(device)


@contextlib.contextmanager
def device(device):
    """Context manager selecting a device (there is one)."""
    _index(device)
    yield


def synchronize(device=None) -> None:
    """Runs what defer mode left pending; waits for every program launched so far."""
    _index(device)
    strict = sys.modules.get("torchtpu.device.strict")
    if strict is not None:
        strict.synchronize()


# --- random numbers ------------------------------------------------------------------------


def _before_rng_change() -> None:
    """Defer mode draws a pending graph's PRNG key at its flush: run random ops recorded
    before a seed or state change first."""
    defer = sys.modules.get("torchtpu.device.defer")
    if defer is not None:
        defer.flush_random("rng state")


def manual_seed(seed: int) -> None:
    _before_rng_change()
    generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    _before_rng_change()
    generator().seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return generator().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    _index(device)
    _before_rng_change()
    return generator().get_state()


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _index(device)
    _before_rng_change()
    generator().set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    set_rng_state(new_states[0])


# --- the hardware ----------------------------------------------------------------------------

_PLATFORM_WORDS = {"tpu": "TPU", "gpu": "GPU (XLA)", "cpu": "CPU emulation (XLA CPU)"}


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str  # "tpu", "gpu" or "cpu"
    device_kind: str  # jax's device_kind, e.g. "TPU v5 lite", "cpu"
    total_memory: int  # bytes
    emulated: bool  # no TPU: another platform runs the programs


def get_device_name(device=None) -> str:
    """Which platform runs the device, e.g. "TPU v5 lite", "CPU emulation (XLA CPU)"."""
    return get_device_properties(device).name


def get_device_properties(device=None) -> DeviceProperties:
    _index(device)
    from torchtpu.device import transfer

    dev = transfer.device()
    words = _PLATFORM_WORDS.get(dev.platform, dev.platform)
    name = dev.device_kind if dev.platform == "tpu" else f"{words}: {dev.device_kind}"
    return DeviceProperties(name, dev.platform, dev.device_kind, mem_get_info()[1], dev.platform != "tpu")


def get_device_capability(device=None) -> tuple[int, int]:
    _index(device)
    return (0, 0)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: every XLA platform computes bfloat16 (the CPU by emulating it)."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes `torch.autocast("tpu", dtype=...)` accepts (torch asks the device module)."""
    return [torch.bfloat16, torch.float16]


# --- memory ----------------------------------------------------------------------------------


def memory_allocated(device=None) -> int:
    """Bytes held by live tpu storages (what torch.cuda.memory_allocated counts: tensors, not
    programs or the runtime's own buffers)."""
    _index(device)
    return storage.memory_allocated()


def max_memory_allocated(device=None) -> int:
    _index(device)
    return storage.max_memory_allocated()


def reset_peak_memory_stats(device=None) -> None:
    _index(device)
    storage.reset_peak()


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the device's memory; on the CPU platform, of the host's."""
    _index(device)
    from torchtpu.device import transfer

    stats = transfer.device().memory_stats() or {}
    if "bytes_limit" in stats:
        total = int(stats["bytes_limit"])
        return total - int(stats.get("bytes_in_use", 0)), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def empty_cache() -> None:
    """Nothing to release: a storage's device array goes when its last tensor does."""
