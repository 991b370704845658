"""The compiler process: XLA:CPU compiles for its parent, one at a time (compiler/worker.py).

    python -m torchtpu.compiler.worker_main     (started by the parent, never by hand)

Reads framed requests on stdin (a StableHLO module's bytecode, XLA's serialized compile options
and the FFI targets the parent has registered, which it registers too: XLA resolves a custom
call as it compiles), compiles each with its own CPU client and answers on the original stdout
with the executable's PJRT serialization, or with the error XLA raised. Anything else that writes to
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

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # XLA's INFO lines off, as `import jax` has them
    from jaxlib import _jax
    from jaxlib import xla_client as xc  # jaxlib alone: JAX's Python would add a second to the start

    client = xc.make_cpu_client()
    devices = _jax.DeviceList((client.local_devices()[0],))
    registered = _jaxlibs_targets(xc)
    frames.write(replies, {"ready": True, "pid": os.getpid()})
    _warm_up(client, devices, xc)
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


_TRIVIAL = "func.func public @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }"


def _warm_up(client, devices, xc) -> None:
    """One trivial compile while the parent still lowers its first program: XLA's first compile
    in a process sets up its compiler (a quarter second here), and the parent's should not wait."""
    try:
        client.compile_and_load(_TRIVIAL, devices, xc.CompileOptions())
    except Exception:  # noqa: BLE001 — only a warm-up; the real compiles report their own errors
        pass


def _jaxlibs_targets(xc) -> set[str]:
    """The CPU custom calls JAX registers as it imports (LAPACK, sparse): a program lowered by
    JAX may call them. Returns their names."""
    from jaxlib import cpu_sparse, lapack

    names = set()
    for module in (lapack, cpu_sparse):
        for name, capsule, api_version in module.registrations().get("cpu", []):
            xc.register_custom_call_target(name, capsule, "cpu", api_version)
            names.add(name)
    return names


def _register(targets, registered: set[str]) -> None:
    """The parent's FFI targets (kernels/aten_cpu.py `registrations`), each once: the library
    loaded by path (it finds torch's libraries itself; torch's Python is not imported here)."""
    from jaxlib import xla_client as xc

    for target, path, symbol in targets:
        if target not in registered:
            function = getattr(ctypes.CDLL(path), symbol)
            xc.register_custom_call_target(target, _capsule(function), "cpu", 1)
            registered.add(target)


def _capsule(function) -> object:
    """A PyCapsule of a ctypes function's address, as XLA's registration takes it: what
    `jax.ffi.pycapsule` makes, here without importing JAX (a second of this process's start)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.cast(function, ctypes.c_void_p).value, None, None)


if __name__ == "__main__":
    sys.exit(main())
