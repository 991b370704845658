"""The cache as compile_graph sees it: key, lookup (memory -> disk), store.

Every outcome is counted (torchtpu.stats(), and per cache directory in stats.json) and
recorded in the compile-event log. Problems with the directory are warnings, never errors.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from torchtpu import counters, events, paths
from torchtpu.cache import entry as entries
from torchtpu.cache import key as keys
from torchtpu.cache import program as programs
from torchtpu.cache.canonical import Unkeyable
from torchtpu.cache.entry import CorruptEntry
from torchtpu.cache.memory import MemoryTier
from torchtpu.cache.store import DiskStore
from torchtpu.cache.warn import log, warn_once
from torchtpu.paths import default_root
from torchtpu.layout import ProgramLayout
from torchtpu.runtime.executable import UNCOUNTED, Executable, load
from torchtpu.runtime.target import Target

MEMORY = MemoryTier()
_disk: dict[Path, DiskStore | None] = {}
_read_only: set[Path] = set()


def disk() -> DiskStore | None:
    """The store of TORCHTPU_CACHE_DIR, or None (off, or a directory we do not trust)."""
    root = default_root()
    if root is None:
        return None
    if root not in _disk:
        _disk[root] = DiskStore(root) if trusted(root) else None
    return _disk[root]


def trusted(root: Path) -> bool:
    """Loading an executable runs its machine code: only a directory that no one but this user
    (or root) can write to is used."""
    try:
        why = paths.untrusted(root)
    except OSError as exc:
        warn_once("read", f"cannot stat {root} ({exc}); the disk cache is off")
        return False
    if why is not None:
        warn_once("untrusted", f"{why}; the disk cache is off (an entry is machine code this process would run)")
        return False
    return True


def key_for(gm, spec: tuple, options, target: Target, name: str) -> keys.CacheKey | None:
    """The cache key, or None (logged, counted) when the graph cannot be keyed reliably."""
    try:
        return keys.key_for(gm, spec, options, target)
    except Unkeyable as exc:
        _outcome("bypass", name, target, None, reason=str(exc))
        log.info("torchtpu cache: %s bypasses the cache: %s", name, exc)
        return None


def lookup(key: keys.CacheKey | None, target: Target, device, name: str, waits: bool = False) -> Executable | None:
    """The executable for `key` from memory, else from disk (for a caller that `waits` for the
    results or not: runtime/executable.py `load`), else None (a miss)."""
    if key is None:
        return None
    digest = key.digest
    exe = MEMORY.get(_in_memory(digest, waits))
    if exe is not None:
        counters.bump("memory_hits")
        _outcome("memory_hit", name, target, digest)
        return exe
    store = disk()
    exe = _load(store, digest, target, device, waits) if store is not None else None
    if exe is None:
        _outcome("miss", name, target, digest)
        return None
    MEMORY.put(_in_memory(digest, waits), exe)
    counters.bump("disk_hits")
    _outcome("disk_hit", name, target, digest)
    return exe


def _load(store: DiskStore, digest: str, target: Target, device, waits: bool) -> Executable | None:
    t0 = time.perf_counter()
    try:
        found = store.get(digest)
        if found is None:
            return None
        if not target.runnable:  # a TPU executable with no TPU here: checked, not loaded
            return Executable(None, found.layout, device)
        exe = load(found.blobs[entries.EXECUTABLE], found.layout, device, waits, found.meta.get("flops", UNCOUNTED))
    except OSError as exc:
        warn_once("read", f"cannot read {store.root} ({exc}); compiling")
        return None
    except Exception as exc:  # noqa: BLE001 — CorruptEntry, or PJRT refusing the bytes
        reason = str(exc) if isinstance(exc, CorruptEntry) else f"executable does not load ({exc})"
        warn_once("corrupt", f"entry {digest[:12]} in {store.root} is bad: {reason}; recompiling and replacing it")
        counters.bump("cache_corrupt")
        _bump_disk(store, "corrupt", target.platform)
        with contextlib.suppress(OSError):
            store.remove(digest)
        return None
    counters.add_seconds("cache_load", time.perf_counter() - t0)
    return exe


def _in_memory(digest: str, waits: bool) -> str:
    """The memory tier's key: one loaded executable per entry and kind of caller (one that waits
    for the results may run it inline, the eager device does not: runtime/executable.py `load`)."""
    return f"{digest}:waits" if waits else digest


def store(key: keys.CacheKey | None, exe: Executable, lowered, blob: bytes | None = None, waits: bool = False,
          **info) -> None:
    """Keeps `exe` in memory (for lookups with the same `waits`) and, when possible, on disk
    (atomically): `blob`, the bytes it was loaded from, else its serialization. Never raises for I/O."""
    if key is None:
        return
    digest = key.digest
    MEMORY.put(_in_memory(digest, waits), exe)
    target: Target = info.pop("target")
    disk_store = disk()
    if disk_store is None or disk_store.root in _read_only:
        return
    try:
        program, fmt = programs.to_portable(lowered)
        blobs = {entries.PROGRAM: program, entries.EXECUTABLE: blob if blob is not None else exe.serialize()}
        new = entries.make(key, blobs, exe.layout, program_format=fmt, platform=target.platform,
                           target=f"{target.platform} {target.device_kind} x{target.device_count}",
                           topology=target.topology, created=time.time(), **info)
    except Unkeyable as exc:
        _outcome("bypass", info.get("graph_name", "?"), target, digest, reason=str(exc))
        return
    try:
        wrote = disk_store.put(digest, new)
    except OSError as exc:
        _read_only.add(disk_store.root)
        warn_once("write", f"cannot write to {disk_store.root} ({exc}); compiling without the disk cache")
        return
    if wrote:
        _outcome("store", info.get("graph_name", "?"), target, digest)


def _outcome(result: str, name: str, target: Target, digest: str | None, **fields) -> None:
    counters.bump(f"cache_{result}")
    events.record("cache", graph=name, result=result, platform=target.platform,
                  key=digest[:16] if digest else None, **fields)
    store = disk()
    if store is not None and store.root not in _read_only:
        _bump_disk(store, result, target.platform)


def _bump_disk(store: DiskStore, result: str, platform: str) -> None:
    with contextlib.suppress(OSError):
        store.bump_stats(result, platform)
