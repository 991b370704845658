"""Process-wide counters: `torchtpu.stats()` and `torchtpu.reset_stats()`."""
from __future__ import annotations

import collections
import threading

_COUNTERS = (
    "dynamo_graphs",  # graphs received from Dynamo
    "aot_graphs",  # forward/backward graphs received from AOTAutograd
    "xla_compiles",  # XLA compilations performed in this process
    "memory_hits",  # executables found in the in-process cache
    "disk_hits",  # executables found in the on-disk cache
    "fallback_ops",  # ATen ops run eagerly instead of on the device (counted per compiled graph)
    "device_regions",  # device programs graphs with host ops were split into (per compiled graph)
    "transfers",  # tensors that crossed host<->device between a graph's programs (per call)
    "eager_frames",  # frames switched to eager before Dynamo's recompile limit (torchtpu/recompile_limit.py)
    "eager_calls",  # calls of those frames that matched no compiled graph and ran eagerly
)

_lock = threading.Lock()
_counts: collections.Counter = collections.Counter()
_seconds: collections.Counter = collections.Counter()


def bump(name: str, by: int = 1) -> None:
    with _lock:
        _counts[name] += by


def add_seconds(name: str, seconds: float) -> None:
    with _lock:
        _seconds[name] += seconds


def stats() -> dict:
    """Returns the counters (ints) and accumulated seconds (`*_s`, floats) of this process."""
    with _lock:
        out = {name: int(_counts[name]) for name in _COUNTERS}
        out.update({k: v for k, v in _counts.items() if k not in out})
        out.update({f"{k}_s": round(v, 6) for k, v in _seconds.items()})
        return out


def reset_stats() -> None:
    with _lock:
        _counts.clear()
        _seconds.clear()
