"""The C heap around XLA:CPU: free pages handed back around a compile (glibc's malloc_trim),
and program buffers kept from one call to the next (glibc's mallopt).

Tracing and lowering a graph free tens of MB on the calling thread's heap, and XLA compiles on
its own threads, whose allocations come from other malloc arenas: without a trim the freed
pages stay resident while the compile grows its own, and the process's peak holds both
(docs/DECISIONS.md 95). A trim costs about 0.1 ms; elsewhere than glibc it does nothing.

Each call of an XLA:CPU program allocates its temporaries as one block and frees it at the end.
glibc serves a block above its mmap threshold (which it raises as blocks are freed, to 32 MB at
most) with a fresh mapping, and a thread arena's large block with a fresh heap it deletes on
free: either way every call faults the whole block in again, a page at a time (the benchmark
UNet: 43.5 MB, 10,600 faults and ~25 ms of a 76 ms call). `keep_buffers_for` has glibc serve
such blocks from its heaps and keep them, once a program whose temporaries exceed 32 MB is
loaded (DECISIONS 102); `TORCHTPU_CPU_HEAP=0` leaves glibc's defaults.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

from torchtpu import cxx


# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's dynamic mmap threshold never rises past this (64-bit)
KEEP_FREE_BYTES = 256 << 20  # free memory a heap's top keeps before it is given back
TOP_PAD_BYTES = 64 << 20  # address space a heap reserves beyond a request (untouched: not resident)


@functools.cache
def _libc_function(name: str):
    """`name` from the C library, or None (not glibc, or no C library found)."""
    lib = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(lib), name, None) if lib else None
    except OSError:
        return None


def release_free_pages() -> bool:
    """Returns the heap's free pages to the OS; False where the C library has no malloc_trim."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def keep_buffers_for(temp_bytes: int) -> bool:
    """Called with each CPU program's temporary bytes (XLA's compiled memory stats) as it is
    compiled or loaded: a block glibc would map afresh every call turns on keep_program_buffers.
    Returns whether the settings are in effect."""
    if temp_bytes > MMAP_THRESHOLD_MAX:
        return keep_program_buffers()
    return applied()


def applied() -> bool:
    return keep_program_buffers.cache_info().currsize > 0 and keep_program_buffers()


@functools.cache
def keep_program_buffers() -> bool:
    """Once per process: large blocks come from the heaps and stay there between calls (see the
    module docstring). Freed memory beyond KEEP_FREE_BYTES at a heap's top still goes back to
    the OS, and so does every free page at each compile (release_free_pages). Returns whether
    glibc took the settings."""
    if not cxx.switched_on("TORCHTPU_CPU_HEAP"):
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return all([mallopt(M_MMAP_MAX, 0), mallopt(M_TRIM_THRESHOLD, KEEP_FREE_BYTES), mallopt(M_TOP_PAD, TOP_PAD_BYTES)])
