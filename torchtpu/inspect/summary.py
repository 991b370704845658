"""Aggregates an event list: per frame compiles, recompiles, buckets, seconds; cache hit rate."""
from __future__ import annotations

import collections
import os

from torchtpu.explain import category, explain, frame_of


_EAGER_GRAPHS = (("defer_", "eager device: defer-mode flushes"), ("eager_", "eager device: strict ops"))


def summarize(events: list[dict]) -> dict:
    """Returns {"totals": {...}, "frames": [{...}], "reasons": {category: n}, "recompiles": [{...}],
    "eager_frames": [{...}]} (frames run eagerly past the recompile limit, with the new input shapes that did)."""
    names = _frame_names(events)
    graph_frame = {(e.get("run"), e.get("graph")): (e.get("run"), frame_of(e.get("compile_id")))
                   for e in events if e.get("kind") == "bucketing"}
    frames: dict = collections.defaultdict(lambda: {"compiles": 0, "recompiles": 0, "graphs": 0,
                                                    "buckets": set(), "seconds": 0.0})

    def frame(run, fid, graph=None):
        if fid is None and graph:  # the eager device's programs have no Dynamo frame
            for prefix, label in _EAGER_GRAPHS:
                if graph.startswith(prefix):
                    return label
        return names.get((run, fid)) or f"frame {fid}"

    for e in events:
        kind, run = e.get("kind"), e.get("run")
        if kind == "graph":
            frames[frame(run, frame_of(e.get("compile_id")))]["graphs"] += 1
        elif kind == "compile":
            f = frames[frame(*graph_frame.get((run, e.get("graph")), (run, None)), e.get("graph"))]
            f["compiles"] += 1
            f["seconds"] += (e.get("lower_ms", 0) + e.get("compile_ms", 0)) / 1e3
        elif kind == "bucket":
            f = frames[frame(*graph_frame.get((run, e.get("graph")), (run, None)))]
            f["buckets"].add(e.get("bucket"))
        elif kind == "dynamo" and category(e):
            frames[frame(run, frame_of(e.get("compile_id")))]["recompiles"] += 1
    recompiles = [{"compile_id": e.get("compile_id"), "frame": frame(e.get("run"), frame_of(e.get("compile_id"))),
                   "category": category(e), "reason": e.get("recompile_reason") or e.get("fail_reason"),
                   "explanation": explain(e, events)}
                  for e in events if e.get("kind") == "dynamo" and category(e)]
    eager = [{"compile_id": e.get("compile_id"), "frame": frame(e.get("run"), frame_of(e.get("compile_id"))),
              "graphs": e.get("graphs"), "limit": e.get("limit"), "explanation": e.get("explanation"),
              "eager_inputs": [c.get("inputs") for c in events if c.get("kind") == "eager_call"
                               and c.get("run") == e.get("run") and c.get("compile_id") == e.get("compile_id")]}
             for e in events if e.get("kind") == "eager_frame"]
    cache = collections.Counter(e.get("result") for e in events if e.get("kind") == "cache")
    hits, misses = cache["memory_hit"] + cache["disk_hit"], cache["miss"]
    table = [{"frame": k, **{**v, "buckets": len(v["buckets"]), "seconds": round(v["seconds"], 3)}}
             for k, v in frames.items()]
    return {
        "totals": {
            "frames": len(frames), "graphs": sum(f["graphs"] for f in table),
            "compiles": sum(f["compiles"] for f in table), "recompiles": len(recompiles),
            "seconds_compiling": round(sum(f["seconds"] for f in table), 3),
            "dynamo_seconds": round(sum(e.get("seconds") or 0 for e in events if e.get("kind") == "dynamo"), 3),
            "cache_hits": hits, "cache_misses": misses,
            "cache_hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
            "eager_frames": len(eager),
        },
        "frames": sorted(table, key=lambda f: -f["compiles"]),
        "reasons": dict(collections.Counter(r["category"] for r in recompiles).most_common()),
        "recompiles": recompiles,
        "eager_frames": eager,
        "flushes": flushes_by_reason(events),
    }


def flushes_by_reason(events: list[dict]) -> dict:
    """Defer mode's flushes (kind "flush") per reason: how many, ops run, how each program was
    found ("hit": the process's own lookup; "cache": compile_graph's memory or disk cache;
    "compile": XLA compiled it), failures, and the user lines that forced them most often."""
    out: dict = {}
    for e in events:
        if e.get("kind") != "flush":
            continue
        r = out.setdefault(e.get("reason") or "?", {"flushes": 0, "ops": 0, "hit": 0, "cache": 0, "compile": 0,
                                                   "errors": 0, "sources": collections.Counter()})
        r["flushes"] += 1
        r["ops"] += e.get("ops") or 0
        if e.get("error"):
            r["errors"] += 1
        elif e.get("cache") in ("hit", "cache", "compile"):
            r[e["cache"]] += 1
        r["sources"][e.get("source") or "?"] += 1
    for r in out.values():
        r["sources"] = [f"{n}x {source}" for source, n in r["sources"].most_common(3)]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["flushes"]))


def _frame_names(events) -> dict:
    """(run, frame number) -> 'fn (file.py:12)' from Dynamo's records, else the graph's source line."""
    out = {}
    for e in events:
        key = (e.get("run"), frame_of(e.get("compile_id")))
        if e.get("kind") == "dynamo" and e.get("co_name"):
            out[key] = f"{e['co_name']} ({os.path.basename(e.get('co_filename') or '?')}:{e.get('co_firstlineno')})"
        elif e.get("kind") == "graph" and e.get("source") and key not in out:
            out[key] = e["source"]
    return out
