"""`torchtpu cache prewarm module:function`: compile every example input set into the cache.

The function returns (model, [input_tuple, ...]). Each input set goes through
torch.compile(model, backend="tpu") after a Dynamo reset, as a fresh process's first call
would, so the keys are the ones a later run looks up. --jobs N spreads sets over N processes.
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


def load_target(target: str):
    module, _, function = target.partition(":")
    if not module or not function:
        raise SystemExit(f"prewarm target {target!r}: use module:function")
    sys.path.insert(0, os.getcwd())
    model, input_sets = getattr(importlib.import_module(module), function)()
    return model, [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in input_sets]


def compile_one(model, inputs: tuple) -> dict:
    """Compiles (and, on a real device, runs) one input set; says whether it was compiled or cached."""
    import torch
    import torch._dynamo

    import torchtpu
    from torchtpu.runtime.executable import NotRunnableHere

    torch._dynamo.reset()
    before = torchtpu.stats()
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    with torch.no_grad():
        try:
            compiled(*inputs)
        except NotRunnableHere:
            pass  # deviceless TPU compile: stored, not runnable here
    after = torchtpu.stats()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in ("xla_compiles", "memory_hits", "disk_hits")}
    return {"status": "compiled" if delta["xla_compiles"] else "cached", "seconds": round(time.perf_counter() - t0, 3),
            **delta}


def run(target: str, jobs: int = 1, tpu_topology: str | None = None, worker: tuple[int, int] | None = None,
        out=sys.stderr) -> list[dict]:
    """Prewarms the cache; prints one progress line per input set to `out`. Returns the results."""
    if jobs > 1 and worker is None:
        return _run_parallel(target, jobs, tpu_topology, out)
    from torchtpu.runtime.target import deviceless_tpu

    model, input_sets = load_target(target)
    indices = range(len(input_sets)) if worker is None else range(worker[0], len(input_sets), worker[1])
    results = []
    with deviceless_tpu(tpu_topology) if tpu_topology else nullcontext():
        for i in indices:
            result = {"index": i, "inputs": _shapes(input_sets[i]), **compile_one(model, input_sets[i])}
            results.append(result)
            if worker is not None:
                print(json.dumps(result), flush=True)
            else:
                _progress(out, len(results), len(input_sets), result)
    return results


def _run_parallel(target, jobs, tpu_topology, out) -> list[dict]:
    _, input_sets = load_target(target)
    total, results, lock = len(input_sets), [], threading.Lock()
    procs = []
    for w in range(min(jobs, max(total, 1))):
        cmd = [sys.executable, "-m", "torchtpu.cli", "cache", "prewarm", target, "--worker", f"{w}/{jobs}"]
        if tpu_topology:
            cmd += ["--target", "tpu", "--topology", tpu_topology]
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
    return sorted(results, key=lambda r: r["index"])


def _shapes(inputs) -> str:
    return ", ".join(f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}" if hasattr(x, "shape") else repr(x)
                     for x in inputs)


def _progress(out, done: int, total: int, r: dict) -> None:
    width = 20
    bar = "#" * (width * done // max(total, 1))
    status = "compiled" if r["status"] == "compiled" else "already cached"
    print(f"[{bar:<{width}}] {done}/{total} set {r['index']} ({r['inputs']}): {status} in {r['seconds']:.2f}s",
          file=out, flush=True)
