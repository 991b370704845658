"""The C heap's free pages go back to the OS around each XLA compile (runtime/heap.py)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from helpers import compile_tpu
from torchtpu.runtime import heap

_HOLE = textwrap.dedent("""
    import ctypes, os, sys
    from torchtpu.runtime import heap

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page / 2**20

    blocks = [libc.malloc(16384) for _ in range(4096)]   # 64 MB below the mmap threshold
    for b in blocks:
        ctypes.memset(b, 1, 16384)
    pin = libc.malloc(16384)                             # keeps the freed run off the heap's top
    base = rss_mb()
    for b in blocks:
        libc.free(b)
    freed = rss_mb()
    released = heap.release_free_pages()
    print(released, round(base - freed, 1), round(freed - rss_mb(), 1))
""")


def test_release_returns_a_freed_run_in_the_middle_of_the_heap():
    out = subprocess.run([sys.executable, "-c", _HOLE], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"                  # glibc: this test's platform
    assert float(out[1]) < 8                 # free() alone keeps the pages resident (the run is not at the top)
    assert float(out[2]) > 48                # the release hands most of the 64 MB back


def test_each_xla_compile_is_bracketed_by_a_release(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "release_free_pages", lambda: calls.append(1) or True)
    fn = compile_tpu(lambda x: torch.sin(x) * 3 + 1.375)
    x = torch.randn(13, 3, 11)               # a graph no other test compiles: never a cache hit
    torch.testing.assert_close(fn(x), torch.sin(x) * 3 + 1.375)
    assert len(calls) == 2
    fn(x)                                    # no compile, no release
    assert len(calls) == 2
