"""Cache problems are warnings, each kind once per process; compiling goes on."""
from __future__ import annotations

import logging
import threading
import warnings

log = logging.getLogger("torchtpu.cache")
_seen: set[str] = set()
_lock = threading.Lock()


class CacheWarning(UserWarning):
    """The compilation cache could not read or write something; the program still compiles."""


def warn_once(kind: str, message: str) -> None:
    with _lock:
        first = kind not in _seen
        _seen.add(kind)
    if first:
        warnings.warn(f"torchtpu cache: {message}", CacheWarning, stacklevel=3)
    else:
        log.info("torchtpu cache: %s", message)
