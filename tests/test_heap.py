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


_FAULTS = textwrap.dedent("""
    import ctypes, os, resource, threading
    from torchtpu.runtime import heap

    if os.environ["TORCHTPU_CPU_HEAP"] == "1":
        heap.keep_program_buffers()          # what opening the CPU device does (platform.device)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, faults = 40 << 20, []

    def calls():                             # as an XLA:CPU thread runs a program: temporaries
        for i in range(6):                   # allocated as one block, written, freed
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            block = libc.malloc(size)
            ctypes.memset(block, 1, size)
            libc.free(block)
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    worker = threading.Thread(target=calls)
    worker.start()
    worker.join()
    print(max(faults[1:]))
""")


def _faults_per_call(env: dict) -> int:
    import os

    run = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return int(run.stdout.split()[-1])


def test_a_programs_large_temporaries_stay_mapped_between_calls():
    """XLA:CPU allocates a program's temporaries per call on its own threads; above glibc's mmap
    threshold (32 MB at most) each call faulted all of them in again (10,240 pages for 40 MB).
    With the heap settings the block stays after the first call; TORCHTPU_CPU_HEAP=0 keeps
    glibc's defaults, and the faults. (The benchmark UNet's 43.5 MB: docs/DECISIONS.md 102.)"""
    assert _faults_per_call({"TORCHTPU_CPU_HEAP": "1"}) < 100
    assert _faults_per_call({"TORCHTPU_CPU_HEAP": "0"}) > 9000
