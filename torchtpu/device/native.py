"""The eager device's C++ registrations (native.cc), built once and loaded with the kernels.

    python -m torchtpu.device.native     # builds it now (`make` does), prints the path

Today: torch's attention-backend stub for the tpu device, so scaled_dot_product_attention
runs as one fused op (device/attention.py) rather than torch's math decomposition; the device
guard, whose synchronize (torch.accelerator.synchronize, Stream/Event.synchronize) calls
torch.tpu.synchronize back; the metadata-only view kernels; and, as the CPython module
torchtpu.device._native, the pieces of every op's path: the body of storage.wrap and of
torch_storage, the storages' byte counters, call.describe (with the marker of a tensor
argument), the user's frame, and in defer mode the whole record of a known op from torch's call
of the kernel (defer.py, kernels.py). Built with `$CXX` (default g++) into
TORCHTPU_EXTENSION_DIR like the CPU kernels (cxx.py); where it cannot be built, or with
TORCHTPU_DEVICE_NATIVE=0, attention takes the math path, the guard, the views and all of the
above are Python's (slower, the same results), torch.accelerator.synchronize raises torch's
"Backend doesn't support" error (torch.tpu.synchronize works), and one warning says why.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

from torchtpu import cxx
from torchtpu.device import call, storage

SOURCE = Path(__file__).with_name("native.cc")
log = logging.getLogger("torchtpu.device")
_state: dict = {}  # "ok": loaded in this process; "why": why not


def enabled() -> bool:
    return cxx.switched_on("TORCHTPU_DEVICE_NATIVE")


def library_path() -> Path:
    return cxx.library_path(SOURCE, "device_native", sys.implementation.cache_tag)  # a CPython module too


def load() -> bool:
    """Loads the library (building it the first time); False, with one warning, when it is
    disabled or cannot be built. Called once, while the kernels are registered."""
    if "ok" not in _state:
        if not enabled():
            _state.update(ok=False, why="TORCHTPU_DEVICE_NATIVE is off")
            return False
        try:
            path = cxx.build(SOURCE, library_path(), [], "the tpu device's C++ registrations", python=True)
            lib = _state["lib"] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # its static initializers register
            _state["synchronize"] = callback = _SYNCHRONIZE(_synchronize)  # kept: C++ holds only its address
            lib.torchtpu_set_synchronize(callback)
            atexit.register(lib.torchtpu_set_synchronize, None)  # no call into a finalizing interpreter
            _state["ok"] = True  # its registrations are in: the rest is an optional speed-up
            _use_module(path)
        except (OSError, subprocess.CalledProcessError) as exc:
            _state.update(ok=False, why=cxx.why_not(exc))
            log.warning("torchtpu.device: C++ registrations unavailable (attention takes torch's math path, "
                        "the guard, the view kernels and each op's path are Python's): %s", _state["why"])
    return _state["ok"]


def _use_module(path: Path) -> None:
    """The library's CPython module (the same library: its PyInit) for storage.wrap and call.py."""
    try:
        spec = importlib.util.spec_from_file_location("torchtpu.device._native", path)
        extension = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(extension)
    except ImportError as exc:
        log.warning("torchtpu.device: the C++ module is unavailable (each op's path stays Python's): %s", exc)
        return
    storage.use_native_makers(extension)
    storage.use_native_accounting(extension)
    call.use_native(extension)
    _state["module"] = extension
    deferred = sys.modules.get("torchtpu.device.defer")  # imported before the library loaded
    if deferred is not None:
        deferred.use_native(extension)


def module():
    """The library's CPython module, once loaded (None where it is not): defer.py takes its
    record from it when defer mode first runs (importing defer here would import JAX)."""
    return _state.get("module")


_SYNCHRONIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)


def _synchronize(message: int, size: int) -> int:
    """The guard's synchronize: torch.tpu.synchronize; an error's type and message go back to
    C++ (which raises it as torch's RuntimeError), as ctypes cannot raise through C."""
    try:
        from torchtpu.device import module

        module.synchronize()
        return 0
    except BaseException as e:  # noqa: BLE001 (any error must reach the caller, not stop here)
        text = f"{type(e).__name__}: {e}".encode(errors="replace")[:size - 1]
        ctypes.memmove(message, text, len(text))
        return 1


def loaded() -> bool:
    return _state.get("ok", False)


if __name__ == "__main__":
    if not load():
        sys.exit(f"not built: {_state.get('why')}")
    print(library_path())
