"""The compile-event record: what was compiled, why, how long it took."""
from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_events: list[dict] = []


def record(kind: str, **fields) -> dict:
    event = {"kind": kind, "time": time.time(), **fields}
    with _lock:
        _events.append(event)
    return event


def events() -> list[dict]:
    with _lock:
        return list(_events)


def clear() -> None:
    with _lock:
        _events.clear()
