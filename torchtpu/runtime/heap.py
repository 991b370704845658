"""Hands the C heap's free pages back to the OS around an XLA compile (glibc's malloc_trim).

Tracing and lowering a graph free tens of MB on the calling thread's heap, and XLA compiles on
its own threads, whose allocations come from other malloc arenas: without a trim the freed
pages stay resident while the compile grows its own, and the process's peak holds both
(docs/DECISIONS.md 95). A trim costs about 0.1 ms; elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_free_pages() -> bool:
    """Returns the heap's free pages to the OS; False where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
