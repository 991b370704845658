"""XLA:CPU compiles in a compiler process of their own (docs/DECISIONS.md 122).

A cold start's memory peaked in XLA's compile: each compile's working memory, tens to hundreds
of MB at its peak, part of it kept by the allocator afterwards. Inductor's C++ compiles run in
processes of their own; so do ours. A torch.compile graph on the CPU marks its process
(`enable`, from the backend), and the first compile the caches miss starts one compiler process
(`use`: jaxlib's CPU client alone, 0.2 s to start here, then a trivial compile that sets XLA up
while this process lowers; a warm start that only loads never starts it). From then on each CPU
compile of this process (the eager device's too) goes to it as StableHLO bytecode and XLA's
serialized compile options, and comes back as the executable's PJRT serialization, which this
process loads as it loads one from the disk cache. JAX's own compile path runs around that step
(`compile`): the compile options, the layouts, the shardings and the checks JAX derives are
those of a compile in this process.

A compile that kills the compiler process (out of memory, a crash in XLA) raises
CompilerProcessDied here and leaves this process running; the next compile starts a new one.
`TORCHTPU_COMPILE_WORKER=0` compiles in this process, as does a process whose compiler process
cannot start (one warning; `torchtpu.stats()["compile_worker_unavailable"]`). A process with no
torch.compile graph (the eager device alone) compiles in itself: its first op does not wait for
a compiler process to start.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from torchtpu import counters, cxx
from torchtpu.compiler import frames

log = logging.getLogger("torchtpu.compiler")
_lock = threading.Lock()  # one request at a time; guards _state
_state: dict = {}  # "proc": the Popen, "pid": the process that started it, "ready", "off": why not
COMMAND = [sys.executable, "-m", "torchtpu.compiler.worker_main"]  # the compiler process (tests replace it)


class CompilerProcessDied(RuntimeError):
    """The compiler process exited during a compile (out of memory, a crash in XLA)."""


def wanted() -> bool:
    return cxx.switched_on("TORCHTPU_COMPILE_WORKER")


def enable() -> None:
    """Marks this process as one whose CPU compiles go to a compiler process (the backend calls it
    for each torch.compile graph on the CPU); starts nothing."""
    if wanted():
        with _lock:
            if _state.get("pid") != os.getpid():
                _state.clear()
                _state["pid"] = os.getpid()


def use() -> bool:
    """Whether this compile goes to the compiler process: where `enable` was called in this
    process and it was not found unable to start. Starts it if it is not running (not waiting)."""
    if not active():
        return False
    with _lock:
        _spawn()
        return "off" not in _state


def active() -> bool:
    """Whether this process's CPU compiles go to its compiler process."""
    return wanted() and _state.get("pid") == os.getpid() and "off" not in _state


def compile(lowered, compiler_options: dict | None):
    """`lowered.compile(compiler_options=...)` with XLA's compile done by the compiler process.
    Returns (jax's Compiled, the executable's serialization); the serialization is None where the
    compile ran in this process (the compiler process could not start, or host callbacks)."""
    args = lowered._lowering.compile_args
    client = args["backend"]
    remote = _Remote(client)
    args["backend"] = remote
    try:
        compiled = lowered.compile(compiler_options=compiler_options)
    finally:
        args["backend"] = client
    return compiled, remote.blob


class _Remote:
    """The CPU client as JAX's compile path sees it, with `compile_and_load` sent to the compiler
    process and its bytes loaded here; everything else is the client's own."""

    def __init__(self, client):
        self._client = client
        self.blob: bytes | None = None

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def compile_and_load(self, module, executable_devices, compile_options, host_callbacks=()):
        if not host_callbacks:  # a callback is a Python object of this process: compiled here
            from jax._src.interpreters import mlir

            blob = _request(mlir.module_to_bytecode(module), compile_options.SerializeAsString(),
                            _module_name(module))
            if blob is not None:
                self.blob = blob
                return self._client.deserialize_executable(blob, executable_devices, None)
        kwargs = {"host_callbacks": host_callbacks} if host_callbacks else {}
        return self._client.compile_and_load(module, executable_devices=executable_devices,
                                             compile_options=compile_options, **kwargs)


def _module_name(module) -> str:
    try:
        return str(module.operation.attributes["sym_name"]).strip('"')
    except (KeyError, AttributeError):
        return "a program"


def _request(module: bytes, options: bytes, name: str) -> bytes | None:
    """The compiler process's executable bytes, or None when it cannot start (compile here)."""
    with _lock:
        if _state.get("pid") != os.getpid():  # a forked child: compile here
            return None
        _spawn()
        proc = _state.get("proc")
        if proc is None:
            return None
        if not _state["ready"]:
            try:
                hello = frames.read(proc.stdout)
            except (OSError, ValueError, EOFError):
                hello = None
            if hello is None:
                _unavailable(f"it exited as it started ({_how(proc)}; its messages are above)")
                return None
            _state["ready"] = True
        try:
            frames.write(proc.stdin, {"compile": name, "ffi": _ffi_targets()}, [module, options])
            reply = frames.read(proc.stdout)
            if reply is None:
                raise frames.Truncated("no reply")
        except (OSError, ValueError, EOFError) as exc:
            _state.pop("proc", None)
            counters.bump("compile_worker_deaths")
            raise CompilerProcessDied(
                f"torchtpu: XLA's compiler process (pid {proc.pid}) {_how(proc)} while compiling {name}; "
                "this process goes on, and its next compile starts a new compiler process. If it ran out "
                "of memory, the program is too large for this machine; TORCHTPU_COMPILE_WORKER=0 compiles "
                "in this process instead") from exc
        except BaseException:  # interrupted mid-exchange (Ctrl-C): its reply would answer the next request
            _state.pop("proc", None)
            proc.kill()
            raise
    header, blobs = reply
    if not header["ok"]:
        raise _error(header["type"], header["message"])
    counters.bump("compile_worker_compiles")
    return blobs[0]


def _ffi_targets() -> list:
    from torchtpu.kernels import aten_cpu

    return aten_cpu.registrations()


def _error(kind: str, message: str) -> Exception:
    """The compiler process's error as this process would have raised it."""
    from jax._src.lib import _jax

    if kind in ("JaxRuntimeError", "XlaRuntimeError"):
        return _jax.JaxRuntimeError(message)
    return RuntimeError(f"{kind}: {message}")


def _how(proc: subprocess.Popen) -> str:
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "stopped answering"
    if code < 0:
        name = signal.Signals(-code).name
        return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"exited with status {code}"


def _spawn() -> None:
    """Under _lock: the compiler process of this process (enabled), unless it is running."""
    proc = _state.get("proc")
    if "off" in _state or (proc is not None and proc.poll() is None):
        return
    root = str(Path(__file__).resolve().parents[2])  # where `torchtpu` imports from
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.Popen(COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"})
    except OSError as exc:
        _unavailable(f"it cannot start ({exc})")
        return
    _state.update(proc=proc, ready=False)


def _unavailable(why: str) -> None:
    _state.pop("proc", None)
    _state["off"] = why
    counters.bump("compile_worker_unavailable")
    log.warning("torchtpu: XLA's compiler process is unavailable, %s; this process compiles in itself", why)


@atexit.register
def stop() -> None:
    """Ends this process's compiler process (at exit; tests call it)."""
    with _lock:
        proc = _state.pop("proc", None) if _state.get("pid") == os.getpid() else None
        _state.clear()  # enabled again by the next torch.compile graph
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
