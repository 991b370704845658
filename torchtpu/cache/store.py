"""The on-disk tier: one directory per entry, written atomically, read under a lock, LRU-capped.

    ROOT/v1/entries/ab/<key>/{meta.json, usage.json, program.mlirbc, executable.bin}
    ROOT/v1/locks/ab.lock       per-shard fcntl locks (256 files, never deleted)
    ROOT/v1/tmp/                entries being written, and entries being deleted
    ROOT/v1/stats.json          hit/miss counters of every process that used this directory

An entry is written into tmp/ and renamed into place: readers see all of it or none.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from torchtpu.cache import entry as entries
from torchtpu.cache.entry import CorruptEntry, Entry
from torchtpu.fsutil import atomic_write, locked, tree_bytes

DEFAULT_MAX_BYTES = 10 * 2**30


def default_max_bytes() -> int:
    try:
        return int(os.environ.get("TORCHTPU_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES))
    except ValueError:
        return DEFAULT_MAX_BYTES


class DiskStore:
    """get/put of entries by key digest. I/O errors propagate as OSError; bad entries as CorruptEntry.

    Args:
        root: the cache directory (TORCHTPU_CACHE_DIR).
        max_bytes: the size cap; least recently used entries go first.
    """

    def __init__(self, root: Path, max_bytes: int | None = None):
        self.root = Path(root)
        self.base = self.root / f"v{entries.versions.FORMAT_VERSION}"
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes

    def _dir(self, digest: str) -> Path:
        return self.base / "entries" / digest[:2] / digest

    def _lock(self, digest: str, exclusive: bool = True, blocking: bool = True):
        return locked(self.base / "locks" / f"{digest[:2]}.lock", exclusive, blocking)

    def ensure(self) -> None:
        """Creates the directory tree (private to this user)."""
        for sub in ("entries", "locks", "tmp"):
            (self.base / sub).mkdir(parents=True, exist_ok=True, mode=0o700)

    def get(self, digest: str, touch: bool = True) -> Entry | None:
        """The entry, or None when there is none; `touch` counts a hit. Raises CorruptEntry, OSError."""
        path = self._dir(digest)
        if not path.exists():
            return None
        with self._lock(digest, exclusive=True):
            if not path.exists():
                return None
            try:
                meta = entries.check_meta((path / entries.META).read_bytes(), digest)
                blobs = {}
                for name in entries.BLOBS:
                    blobs[name] = (path / name).read_bytes()
                    entries.check_blob(meta, name, blobs[name])
            except FileNotFoundError as exc:
                raise CorruptEntry(f"{Path(exc.filename).name} is missing") from None
            if touch:
                self._touch(path)
        return Entry(meta, blobs)

    def _touch(self, path: Path) -> None:
        usage = read_usage(path)
        usage = {"hits": usage.get("hits", 0) + 1, "last_used": time.time()}
        with contextlib.suppress(OSError):  # a read-only cache still serves hits
            atomic_write(path / entries.USAGE, json.dumps(usage).encode())

    def put(self, digest: str, entry: Entry) -> bool:
        """Stores `entry` unless a sound one is there already. Returns True if it wrote. Raises OSError."""
        self.ensure()
        tmp = Path(tempfile.mkdtemp(dir=self.base / "tmp", prefix=f"{digest[:12]}."))
        try:
            (tmp / entries.META).write_bytes(entries.dumps_meta(entry.meta))
            for name in entries.BLOBS:
                (tmp / name).write_bytes(entry.blobs[name])
            (tmp / entries.USAGE).write_text(json.dumps({"hits": 0, "last_used": time.time()}))
            final = self._dir(digest)
            final.parent.mkdir(exist_ok=True)
            with self._lock(digest):
                if final.exists():
                    if self._sound(final, digest):
                        return False  # another process stored it first
                    self._discard(final)
                os.rename(tmp, final)
                tmp = None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        self.evict()
        return True

    def _sound(self, path: Path, digest: str) -> bool:
        try:
            entries.check_meta((path / entries.META).read_bytes(), digest)
            return all((path / name).exists() for name in entries.BLOBS)
        except (OSError, CorruptEntry):
            return False

    def remove(self, digest: str) -> None:
        with self._lock(digest):
            path = self._dir(digest)
            if path.exists():
                self._discard(path)

    def _discard(self, path: Path) -> None:
        """Renames out of sight first, so no reader ever sees a half-deleted entry."""
        trash = Path(tempfile.mkdtemp(dir=self.base / "tmp", prefix="trash."))
        os.rename(path, trash / "entry")
        shutil.rmtree(trash, ignore_errors=True)

    def digests(self) -> list[str]:
        root = self.base / "entries"
        if not root.exists():
            return []
        return sorted(p.name for shard in root.iterdir() if shard.is_dir() for p in shard.iterdir())

    def describe(self, digest: str) -> dict:
        """Metadata + usage + size for listing, without checking blobs. Raises CorruptEntry."""
        path = self._dir(digest)
        try:
            meta = json.loads((path / entries.META).read_bytes())
        except (OSError, ValueError) as exc:
            raise CorruptEntry(f"unreadable {entries.META}: {exc}") from None
        return {**meta, **read_usage(path), "size": tree_bytes(path)}

    def evict(self) -> list[str]:
        """Removes least recently used entries until the store fits max_bytes."""
        with locked(self.base / "evict.lock", blocking=False) as got:
            if not got:
                return []  # another process is evicting
            sizes, used = {}, {}
            for digest in self.digests():
                path = self._dir(digest)
                sizes[digest] = tree_bytes(path)
                used[digest] = read_usage(path).get("last_used", 0.0)
            total, removed = sum(sizes.values()), []
            for digest in sorted(sizes, key=used.get):
                if total <= self.max_bytes:
                    break
                self.remove(digest)
                total -= sizes[digest]
                removed.append(digest)
            return removed

    def bump_stats(self, event: str, platform: str) -> None:
        """Adds one to stats.json[event][platform]. Raises OSError."""
        self.base.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(self.base / "stats.lock") as got:
            if not got:
                raise PermissionError(f"cannot lock {self.base / 'stats.lock'}")
            stats = self.read_stats()
            by_platform = stats.setdefault(event, {})
            by_platform[platform] = by_platform.get(platform, 0) + 1
            atomic_write(self.base / "stats.json", json.dumps(stats, sort_keys=True).encode())

    def read_stats(self) -> dict:
        try:
            stats = json.loads((self.base / "stats.json").read_bytes())
            return stats if isinstance(stats, dict) else {}
        except (OSError, ValueError):
            return {}


def read_usage(path: Path) -> dict:
    try:
        usage = json.loads((path / entries.USAGE).read_bytes())
        return usage if isinstance(usage, dict) else {}
    except (OSError, ValueError):
        return {}
