"""The compile-event record: what was compiled, why, how long it took.

Every event is kept in process (`events()`: the newest TORCHTPU_EVENTS_KEEP, default 100000;
`dropped()` counts the older ones let go) and appended as one JSON line to the event log:
`TORCHTPU_EVENT_LOG` (a path, or "off"), else `events.jsonl` in the cache directory
(`TORCHTPU_CACHE_DIR`, else ~/.cache/torchtpu). A log that outgrows TORCHTPU_EVENT_LOG_MB
(default 64) is renamed to `<log>.1` (replacing the one before) and a new one begun: a training
loop in defer mode writes an event per flush, a few per step, and neither the process nor the
disk should grow with the number of steps. Dynamo's own per-frame records (recompile
reason, guard failures, the recompile limit) are drained from
`torch._dynamo.utils.get_compilation_metrics()` into "dynamo" events by `sync_dynamo()`, which
runs as each frame's record is made once the backend has been used (`follow_dynamo()`).
A write error becomes one warning; the in-process record is kept regardless.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

from torchtpu import paths
from torchtpu.explain import explain, frame_history

_lock = threading.Lock()


def _keep() -> int:
    try:
        return max(int(os.environ.get("TORCHTPU_EVENTS_KEEP", "100000")), 1)
    except ValueError:
        return 100000


def _log_limit() -> int:
    try:
        return max(int(float(os.environ.get("TORCHTPU_EVENT_LOG_MB", "64")) * 2**20), 4096)
    except ValueError:
        return 64 * 2**20


_events: collections.deque = collections.deque(maxlen=_keep())  # read once, at import
_dropped = 0
_seen_metrics: set = set()
_warned_frames: set = set()
_log_failed = False
_made: set = set()
RUN = f"{os.getpid()}-{int(time.time())}"  # groups one process's events in a shared log


def record(kind: str, **fields) -> dict:
    global _dropped
    event = {"kind": kind, "time": time.time(), "run": RUN, **fields}
    with _lock:
        if len(_events) == _events.maxlen:
            _dropped += 1
        _events.append(event)
    _append(event)
    return event


def events() -> list[dict]:
    sync_dynamo()
    with _lock:
        return list(_events)


def dropped() -> int:
    """Events recorded in this process that `events()` no longer holds (the oldest go first)."""
    return _dropped


def clear() -> None:
    global _dropped
    with _lock:
        _events.clear()
        _dropped = 0


_LOG_ENV = ("TORCHTPU_EVENT_LOG", "TORCHTPU_CACHE_DIR", "XDG_CACHE_HOME", "HOME")
_log_paths: dict = {}  # by the variables that decide it (resolving ~ costs more than the write)


def log_path() -> Path | None:
    """Where events are appended; None when TORCHTPU_EVENT_LOG=off."""
    env = os.environ
    decided_by = tuple([env.get(v) for v in _LOG_ENV])
    if decided_by not in _log_paths:
        def in_cache_dir():
            root = paths.default_root()
            return None if root is None else root / "events.jsonl"

        _log_paths[decided_by] = paths.from_env("TORCHTPU_EVENT_LOG", in_cache_dir)
    return _log_paths[decided_by]


class _Log:
    """The log's file, kept open between events (defer mode writes one per flush, a few per
    step: opening it each time cost more than the rest of the event). Reopened when the path
    changes or the file at the path is no longer the one open (another process rotated it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.path: Path | None = None
        self.file = None
        self.inode = None

    def write(self, path: Path, line: str) -> None:
        with self.lock:
            f = self._open(path)
            f.write(line)  # one write per line (flushed at once): appends do not interleave
            f.flush()
            if f.tell() > _log_limit():
                self.close()
                try:
                    os.replace(path, path.with_name(path.name + ".1"))
                except FileNotFoundError:  # another process rotated it first
                    pass

    def _open(self, path: Path):
        if self.file is not None and self.path == path:
            try:
                if os.stat(path).st_ino == self.inode:
                    return self.file
            except FileNotFoundError:
                pass
        self.close()
        if path.parent not in _made:
            path.parent.mkdir(parents=True, exist_ok=True)
            _made.add(path.parent)
        self.file = open(path, "a", encoding="utf-8")
        self.path, self.inode = path, os.fstat(self.file.fileno()).st_ino
        return self.file

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
        self.file = self.path = self.inode = None


_log = _Log()
atexit.register(_log.close)


def _append(event: dict) -> None:
    global _log_failed
    path = log_path()
    if path is None or _log_failed:
        return
    try:
        _log.write(path, json.dumps(event, default=str, ensure_ascii=False) + "\n")
    except OSError as exc:
        _log_failed = True
        _log.close()
        warnings.warn(f"torchtpu: cannot write the event log {path}: {exc}; events stay in memory only")


def read_log(path) -> list[dict]:
    """The events of a JSONL log; unreadable lines are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def sync_dynamo() -> None:
    """Records Dynamo's compilation metrics not seen yet as "dynamo" events."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:  # Dynamo never ran in this process: nothing to record, nothing to import
        return
    get_compilation_metrics = utils.get_compilation_metrics
    fresh = []
    with _lock:
        for m in get_compilation_metrics():
            key = (m.compile_id, m.start_time_us)
            if key not in _seen_metrics:
                _seen_metrics.add(key)
                fresh.append(m)
    for m in fresh:
        record("dynamo", compile_id=m.compile_id, frame=f"{m.co_name} ({m.co_filename}:{m.co_firstlineno})",
               co_name=m.co_name, co_filename=m.co_filename, co_firstlineno=m.co_firstlineno,
               recompile_reason=m.recompile_reason, fail_type=m.fail_type, fail_reason=m.fail_reason,
               seconds=round((m.duration_us or 0) / 1e6, 3), graph_ops=m.graph_op_count,
               start=(m.start_time_us or 0) / 1e6,
               cache_size=m.cache_size)
        _maybe_warn(m.co_name, m.co_filename, m.co_firstlineno)


class _NotifyingDeque(collections.deque):
    """Dynamo's deque of CompilationMetrics that calls `on_append` after each record is added."""

    def __init__(self, items: collections.deque, on_append):
        super().__init__(items, items.maxlen)
        self.on_append = on_append

    def append(self, item) -> None:
        super().append(item)
        self.on_append()


def follow_dynamo() -> None:
    """Records Dynamo's metrics seen so far, and from now on each frame's as its compile ends.

    Dynamo's end-of-compile callbacks (torch._dynamo.callback_handler) run before the frame's
    CompilationMetrics exist, and a frame that hits the recompile limit fires none; every record
    is appended to the deque behind get_compilation_metrics(), so that append is where we listen.
    Idempotent; called on every backend call because set_compilation_metrics_limit() replaces
    the deque.
    """
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "_compilation_metrics", None)
    if isinstance(metrics, collections.deque) and not isinstance(metrics, _NotifyingDeque):
        utils._compilation_metrics = _NotifyingDeque(metrics, sync_dynamo)
    sync_dynamo()


def recompile_warn_threshold() -> int:
    try:
        return int(os.environ.get("TORCHTPU_RECOMPILE_WARN", "8"))
    except ValueError:
        return 8


def _maybe_warn(co_name, co_filename, co_firstlineno) -> None:
    frame = f"{co_name} ({co_filename}:{co_firstlineno})"
    if frame in _warned_frames:
        return
    with _lock:
        evs = list(_events)
    mine = [e for e in evs if e["kind"] == "dynamo" and e.get("frame") == frame]
    # this compile session of the frame only: after a Dynamo reset its count starts over
    recompiles = [e for e in frame_history(mine[-1], evs) if e.get("recompile_reason")] if mine else []
    if len(recompiles) <= recompile_warn_threshold():
        return
    _warned_frames.add(frame)

    text = explain(recompiles[-1], events())
    warnings.warn(f"torchtpu: {frame} recompiled {len(recompiles)} times; last: {text} "
                  "(`torchtpu inspect` explains each one)", stacklevel=2)


atexit.register(sync_dynamo)
