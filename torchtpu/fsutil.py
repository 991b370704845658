"""File-system primitives: atomic writes and fcntl locks (the cache store, precompiled artifacts,
the CPU kernel library). Imports nothing of torchtpu."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never a partial one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path, exclusive: bool = True, blocking: bool = True):
    """An fcntl lock on `path` (created if needed). Yields False when it could not be taken
    without blocking (blocking=False) or the lock file cannot be created (read-only storage),
    True otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def tree_bytes(path: Path) -> int:
    total = 0
    for child in path.iterdir():
        with contextlib.suppress(OSError):
            total += child.stat().st_size
    return total
