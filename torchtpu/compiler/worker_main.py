"""The compiler process: XLA:CPU compiles for its parent, one at a time (compiler/worker.py).

    python -m torchtpu.compiler.worker_main     (started by the parent, never by hand)

Reads framed requests on stdin (a StableHLO module's bytecode, XLA's serialized compile options
and the FFI targets the parent has registered, which it registers too: XLA resolves a custom
call as it compiles), compiles each with its own CPU client and answers on the original stdout with the
executable's PJRT serialization, or with the error XLA raised. Anything else that writes to
stdout goes to stderr, which is the parent's. Exits at the end of its input (the parent closed
its end or died) and, on Linux, when the parent dies.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

from torchtpu.compiler import frames


def _die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGTERM): no compiler process outlives a killed parent."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def main() -> int:
    _die_with_parent()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (XLA's, a library's) must not corrupt the replies
    requests = sys.stdin.buffer

    import jax

    jax.config.update("jax_platforms", "cpu")
    from jax._src.lib import _jax
    from jax._src.lib import xla_client as xc

    device = jax.devices("cpu")[0]
    client, devices = device.client, _jax.DeviceList((device,))
    registered: set[str] = set()
    frames.write(replies, {"ready": True, "pid": os.getpid()})
    while True:
        request = frames.read(requests)
        if request is None:
            return 0
        header, blobs = request
        try:
            _register(header.get("ffi", ()), registered)
            options = xc.CompileOptions.ParseFromString(blobs[1])
            executable = client.compile_and_load(blobs[0], devices, options)
            reply = ({"ok": True}, [executable.serialize()])
            del executable
        except Exception as exc:  # noqa: BLE001 — XLA's error goes back to the caller, whole
            reply = ({"ok": False, "type": type(exc).__name__, "message": str(exc)}, [])
        frames.write(replies, *reply)


def _register(targets, registered: set[str]) -> None:
    """The parent's FFI targets (kernels/aten_cpu.py `registrations`), each once: the library
    loaded by path (it finds torch's libraries itself; torch's Python is not imported here)."""
    import jax.ffi

    for target, path, symbol in targets:
        if target not in registered:
            lib = ctypes.CDLL(path)
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
            registered.add(target)


if __name__ == "__main__":
    sys.exit(main())
