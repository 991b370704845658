"""`torchtpu cache ...`: list, count, verify, clear and explain entries of the on-disk store."""
from __future__ import annotations

import json
import time

from torchtpu.cache import entry as entries
from torchtpu.cache import program as programs
from torchtpu.cache.entry import CorruptEntry
from torchtpu.cache.store import DiskStore
from torchtpu.paths import default_root


def open_store() -> DiskStore:
    root = default_root()
    if root is None:
        raise SystemExit("the disk cache is off (TORCHTPU_CACHE_DIR=off)")
    return DiskStore(root)


def _rows(store: DiskStore) -> list[dict]:
    rows = []
    for digest in store.digests():
        try:
            info = store.describe(digest)
        except CorruptEntry as exc:
            info = {"error": str(exc), "size": 0}
        rows.append({"key": digest, "graph": info.get("graph_name", "?"), "inputs": info.get("inputs", "?"),
                     "platform": info.get("platform", "?"), "target": info.get("target", "?"),
                     "size": info.get("size", 0), "hits": info.get("hits", 0),
                     "last_used": info.get("last_used", info.get("created", 0)),
                     "compile_ms": info.get("compile_ms"), **({"error": info["error"]} if "error" in info else {})})
    return rows


def ls(args) -> int:
    rows = _rows(open_store())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'key':12}  {'graph':14}  {'platform':8}  {'size':>9}  {'hits':>5}  {'last used':19}  inputs")
    for r in sorted(rows, key=lambda r: r["last_used"], reverse=True):
        print(f"{r['key'][:12]}  {r['graph'][:14]:14}  {r['platform']:8}  {_size(r['size']):>9}  {r['hits']:>5}  "
              f"{_when(r['last_used']):19}  {r['inputs']}")
    return 0


def stats(args) -> int:
    store = open_store()
    rows = _rows(store)
    out = {"dir": str(store.root), "entries": len(rows), "bytes": sum(r["size"] for r in rows),
           "max_bytes": store.max_bytes, "events": store.read_stats()}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"dir        {out['dir']}\nentries    {out['entries']}\nbytes      {_size(out['bytes'])} "
          f"(cap {_size(out['max_bytes'])})")
    for event, by_platform in sorted(out["events"].items()):
        print(f"{event:12} " + "  ".join(f"{p}={n}" for p, n in sorted(by_platform.items())))
    return 0


def verify_entry(store: DiskStore, digest: str) -> str:
    """Checks one entry; returns what was checked. Raises CorruptEntry.

    Every entry: metadata and blob checksums, versions, and the StableHLO parses. Entries for
    a platform present in this process: the executable is deserialized too. A TPU executable
    cannot be deserialized without a TPU; for those the checks stop at the checksums.
    """
    found = store.get(digest, touch=False)
    if found is None:
        raise CorruptEntry("vanished")
    try:
        programs.parse(found.blobs[entries.PROGRAM], found.meta.get("program_format", ""))
    except Exception as exc:  # noqa: BLE001
        raise CorruptEntry(f"StableHLO does not parse ({exc})") from None
    platform = found.meta.get("platform")
    from torchtpu.runtime import platform as platforms

    if not platforms.available(platform):
        return "checksums, StableHLO (executable not loadable without a " + str(platform) + ")"
    from torchtpu.runtime.executable import Executable

    try:
        Executable.deserialize(found.blobs[entries.EXECUTABLE], found.layout, platforms.device(platform))
    except Exception as exc:  # noqa: BLE001
        raise CorruptEntry(f"executable does not load ({exc})") from None
    return "checksums, StableHLO, executable loads"


def verify(args) -> int:
    store = open_store()
    bad = 0
    for digest in store.digests():
        try:
            checked = verify_entry(store, digest)
            if args.verbose:
                print(f"ok   {digest[:12]}  {checked}")
        except (CorruptEntry, OSError) as exc:
            bad += 1
            store.remove(digest)
            print(f"BAD  {digest[:12]}  {exc} (removed)")
    print(f"{len(store.digests())} entries ok, {bad} bad removed")
    return 0


def clear(args) -> int:
    store = open_store()
    now, removed = time.time(), 0
    for r in _rows(store):
        if args.platform and r["platform"] != args.platform:
            continue
        if args.older_than is not None and now - r["last_used"] < args.older_than * 86400:
            continue
        store.remove(r["key"])
        removed += 1
    print(f"removed {removed} entries")
    return 0


def explain(args) -> int:
    store = open_store()
    matches = [d for d in store.digests() if d.startswith(args.key)]
    if len(matches) != 1:
        raise SystemExit(f"key prefix {args.key!r} matches {len(matches)} entries"
                         + (": " + ", ".join(m[:16] for m in matches) if matches else ""))
    info = store.describe(matches[0])
    print(f"key {matches[0]}\ngraph {info.get('graph_name')}  inputs {info.get('inputs')}  "
          f"target {info.get('target')}")
    for part in info.get("parts", []):
        print(f"  {part['name']:26} {part['digest']}  {part['summary']}")
    return 0


def prewarm(args) -> int:
    from torchtpu.cli import prewarm as prewarming

    if args.target == "tpu" and not args.topology:
        raise SystemExit("--target tpu needs --topology (e.g. v5e:2x2)")
    if args.precompile and args.target == "tpu":
        raise SystemExit("--precompile cannot be used with --target tpu: torchtpu.precompile.save compiles "
                         "and records an artifact for this process's platform, not the deviceless TPU, and a "
                         "loaded artifact takes its executables for the loading process's platform; write "
                         "artifacts on the TPU host (prewarm --precompile DIR there)")
    worker = tuple(int(x) for x in args.worker.split("/")) if args.worker else None
    topology = args.topology if args.target == "tpu" else None
    results = prewarming.run(args.module_function, args.jobs, topology, worker,
                             replay_in_order=args.replay, precompile=args.precompile)
    if worker is None:
        first = [r for r in results if r["phase"] == prewarming.FIRST]
        in_order = [r for r in results if r["phase"] == prewarming.IN_ORDER]
        compiled = sum(r["status"] == "compiled" for r in first)
        line = f"{len(first)} input sets: {compiled} compiled, {len(first) - compiled} already cached (first calls)"
        if in_order:
            again = sum(r["status"] == "compiled" for r in in_order)
            line += f"; in order in one process: {again} compiled, {len(in_order) - again} already cached"
        if args.precompile:
            written = sum("artifact" in r for r in first)
            line += f"; {written} precompiled artifacts and {prewarming.MANIFEST} in {args.precompile}"
        print(line)
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"
