"""The in-process tier: executables by key digest, least recently used dropped first."""
from __future__ import annotations

import collections
import threading


class MemoryTier:
    def __init__(self, max_entries: int = 512):
        self.max_entries = max_entries
        self._items: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str):
        with self._lock:
            value = self._items.get(digest)
            if value is not None:
                self._items.move_to_end(digest)
            return value

    def put(self, digest: str, value) -> None:
        with self._lock:
            self._items[digest] = value
            self._items.move_to_end(digest)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
