"""The eager mode of tpu tensors: how ops on device="tpu" run (docs/device.md).

    strict  each op runs as its own compiled program, kept per op signature (the default)
    defer   ops are recorded into one pending graph; a flush (a value is needed) compiles the
            graph once per shape of the graph and runs it as one program

    torchtpu.eager_mode("defer")       # as a context manager: the mode inside the block
    TORCHTPU_EAGER_MODE=defer          # the process's default
    torchtpu.sync()                    # runs the pending graph now

The mode is process-wide, not per thread: autograd may run a backward pass on another thread
than the one that entered the block. Light to import: nothing here loads JAX or the device.
"""
from __future__ import annotations

import contextlib
import os
import sys

MODES = ("strict", "defer")
_ENV = "TORCHTPU_EAGER_MODE"


def _from_env() -> str:
    value = os.environ.get(_ENV, "").strip().lower() or "strict"
    if value not in MODES:
        raise ValueError(f"{_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


current = _from_env()  # read on every op by torchtpu.device.strict.run


def mode() -> str:
    """The eager mode in effect: "strict" or "defer"."""
    return current


def set_mode(mode: str) -> str:
    """Sets the eager mode for the process; returns the previous one. Leaving defer runs what
    is pending first, so errors of deferred ops surface where the deferred code ends."""
    global current
    if mode not in MODES:
        raise ValueError(f"eager mode {mode!r}: expected one of {', '.join(MODES)}")
    previous = current
    if previous == "defer" and mode != "defer":
        _flush("mode_exit")
    current = mode
    return previous


@contextlib.contextmanager
def eager_mode(mode: str):
    """Runs the block's tpu ops in `mode` ("strict" or "defer"), then restores the mode."""
    previous = set_mode(mode)
    try:
        yield
    finally:
        set_mode(previous)


def sync() -> None:
    """Runs the pending graph of defer mode now (nothing to do in strict mode)."""
    _flush("sync")


def _flush(reason: str) -> None:
    defer = sys.modules.get("torchtpu.device.defer")  # never loaded: nothing can be pending
    if defer is not None:
        defer.flush(reason)
