"""`torchtpu cache prewarm module:function`: compile every example input set into the cache.

The function returns (model, [input_tuple, ...]). Two passes, both under torch.no_grad():

- first calls: each input set goes through torch.compile(model, backend="tpu") after a Dynamo
  reset, as a fresh process's first call would. --jobs N spreads these over N processes.
- in order: all sets, in order, through ONE torch.compile in one process, as a server calls
  it; after a shape change Dynamo makes an automatic-dynamic (symbolic-size) graph, which the
  first calls never see. Skipped with replay=False (--no-replay).

So the keys are the ones a later run looks up either way. With `precompile=DIR` each set is
also saved as a precompiled artifact, DIR/set-{i}.tpu (torchtpu.precompile.save), listed in
DIR/manifest.json.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path

FIRST, IN_ORDER = "first calls", "in order"
MANIFEST = "manifest.json"


def load_target(target: str):
    module, _, function = target.partition(":")
    if not module or not function:
        raise SystemExit(f"prewarm target {target!r}: use module:function")
    sys.path.insert(0, os.getcwd())
    model, input_sets = getattr(importlib.import_module(module), function)()
    return model, [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in input_sets]


def compile_one(model, inputs: tuple) -> dict:
    """Compiles (and, on a real device, runs) one input set as a fresh process's first call;
    says whether it was compiled or cached."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    return _call(compiled, inputs, t0)


def replay(model, input_sets, out=None) -> list[dict]:
    """Calls ONE torch.compile(model) with every input set in order (one Dynamo reset first),
    so the graphs Dynamo makes after a shape change (automatic dynamic) are compiled too."""
    import torch
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    results = []
    for i, inputs in enumerate(input_sets):
        results.append({"index": i, "phase": IN_ORDER, "inputs": _shapes(inputs),
                        **_call(compiled, inputs, time.perf_counter())})
        if out is not None:
            _progress(out, len(results), len(input_sets), results[-1])
    return results


def _call(compiled, inputs: tuple, t0: float) -> dict:
    import torch

    from torchtpu import counters
    from torchtpu.runtime.executable import NotRunnableHere

    before = counters.stats()
    with torch.no_grad():
        try:
            compiled(*inputs)
        except NotRunnableHere:
            pass  # deviceless TPU compile: stored, not runnable here
    after = counters.stats()
    delta = {k: after.get(k, 0) - before.get(k, 0)
             for k in ("xla_compiles", "memory_hits", "disk_hits", "dynamo_graphs")}
    return {"status": "compiled" if delta["xla_compiles"] else "cached", "seconds": round(time.perf_counter() - t0, 3),
            **delta}


def save_artifact(model, inputs: tuple, folder: Path, index: int) -> dict:
    """Writes folder/set-{index}.tpu (torchtpu.precompile.save, under torch.no_grad: grad mode
    is guarded, and prewarm's calls are inference)."""
    import torch

    from torchtpu.precompile import api as precompiling

    path = Path(folder) / f"set-{index}.tpu"
    t0 = time.perf_counter()
    with torch.no_grad():
        precompiling.save(model, inputs, path)
    return {"file": path.name, "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 3)}


def run(target: str, jobs: int = 1, tpu_topology: str | None = None, worker: tuple[int, int] | None = None,
        out=sys.stderr, replay_in_order: bool = True, precompile: str | os.PathLike | None = None) -> list[dict]:
    """Prewarms the cache; prints one progress line per input set and pass (and per artifact)
    to `out`. Returns the results, each with "phase": FIRST or IN_ORDER."""
    if precompile is not None and tpu_topology:
        raise ValueError("precompiled artifacts are for this process's platform, not a deviceless TPU")
    folder = Path(precompile) if precompile is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    if jobs > 1 and worker is None:
        return _run_parallel(target, jobs, tpu_topology, out, replay_in_order, folder)
    from torchtpu.runtime.target import deviceless_tpu

    model, input_sets = load_target(target)
    indices = range(len(input_sets)) if worker is None else range(worker[0], len(input_sets), worker[1])
    results = []
    with deviceless_tpu(tpu_topology) if tpu_topology else nullcontext():
        for i in indices:
            result = {"index": i, "phase": FIRST, "inputs": _shapes(input_sets[i]),
                      **compile_one(model, input_sets[i])}
            if folder is not None:
                result["artifact"] = save_artifact(model, input_sets[i], folder, i)
            results.append(result)
            if worker is not None:
                print(json.dumps(result), flush=True)
            else:
                _progress(out, len(results), len(input_sets), result)
        if worker is None and replay_in_order:
            results += replay(model, input_sets, out)
    if worker is None and folder is not None:
        write_manifest(folder, target, input_sets, results)
    return results


def _run_parallel(target, jobs, tpu_topology, out, replay_in_order, folder) -> list[dict]:
    model, input_sets = load_target(target)
    total, results, lock = len(input_sets), [], threading.Lock()
    procs = []
    for w in range(min(jobs, max(total, 1))):
        cmd = [sys.executable, "-m", "torchtpu.cli", "cache", "prewarm", target, "--worker", f"{w}/{jobs}"]
        if tpu_topology:
            cmd += ["--target", "tpu", "--topology", tpu_topology]
        if folder is not None:
            cmd += ["--precompile", str(folder)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))

    def read(proc):
        for line in proc.stdout:
            if line.startswith("{"):
                with lock:
                    results.append(json.loads(line))
                    _progress(out, len(results), total, results[-1])

    threads = [threading.Thread(target=read, args=(p,)) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [p.wait() for p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"prewarm: {len(failed)} worker(s) failed")
    results.sort(key=lambda r: r["index"])
    if replay_in_order:  # one process, after the workers: their entries are on disk by now
        from torchtpu.runtime.target import deviceless_tpu

        with deviceless_tpu(tpu_topology) if tpu_topology else nullcontext():
            results += replay(model, input_sets, out)
    if folder is not None:
        write_manifest(folder, target, input_sets, results)
    return results


def write_manifest(folder: Path, target: str, input_sets, results) -> Path:
    """folder/manifest.json: per artifact its set's index, inputs (shape and dtype) and file name."""
    from torchtpu.fsutil import atomic_write

    sets = [{"index": r["index"], "inputs": [_describe(x) for x in input_sets[r["index"]]],
             "file": r["artifact"]["file"]}
            for r in sorted(results, key=lambda r: r["index"]) if r["phase"] == FIRST and "artifact" in r]
    path = Path(folder) / MANIFEST
    atomic_write(path, (json.dumps({"target": target, "sets": sets}, indent=1) + "\n").encode())
    return path


def _describe(x) -> dict:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", "")}
    return {"value": repr(x)}


def _shapes(inputs) -> str:
    return ", ".join(f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}" if hasattr(x, "shape") else repr(x)
                     for x in inputs)


def _progress(out, done: int, total: int, r: dict) -> None:
    width = 20
    bar = "#" * (width * done // max(total, 1))
    status = "compiled" if r["status"] == "compiled" else "already cached"
    phase = r.get("phase", FIRST)
    note = ", new Dynamo graph" if phase == IN_ORDER and r.get("dynamo_graphs") and r["index"] > 0 else ""
    print(f"{phase:<11} [{bar:<{width}}] {done}/{total} set {r['index']} ({r['inputs']}): {status} "
          f"in {r['seconds']:.2f}s{note}", file=out, flush=True)
    if "artifact" in r:
        a = r["artifact"]
        print(f"{'precompile':<11} set {r['index']}: wrote {a['file']} ({a['bytes']} bytes) in {a['seconds']:.2f}s",
              file=out, flush=True)
