"""Cold vs warm on-disk cache, side by side, for the 2-layer HF Llama decoder.

A: a fresh process with an empty TORCHTPU_CACHE_DIR. B: a fresh process with the cache A left.

    python -m benchmarks.cache_bench

Prints, for A and B: seconds from the torch.compile call to the first result; XLA compiles;
the compile-dependent part (lowering + XLA compile + loading from the cache); the median
steady-state call in ms (the same PJRT call path either way).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def measure() -> dict:
    import time
    import warnings

    import torch

    import torchtpu
    from benchmarks.run import build
    from benchmarks.timing import median_ms

    warnings.filterwarnings("ignore")
    model, inputs = build("hf_llama")
    with torch.no_grad():
        t0 = time.perf_counter()
        fn = torch.compile(model, backend="tpu", fullgraph=True)
        fn(*inputs)
        first = time.perf_counter() - t0
        ms = median_ms(lambda: fn(*inputs), warmup=3, runs=30)
    s = torchtpu.stats()
    dependent = s.get("lower_s", 0) + s.get("compile_s", 0) + s.get("cache_load_s", 0)
    return {"first_result_s": first, "xla_compiles": s["xla_compiles"], "disk_hits": s["disk_hits"],
            "compile_dependent_s": dependent, "median_ms": ms}


def child(cache_dir: str) -> dict:
    env = {**os.environ, "TORCHTPU_CACHE_DIR": cache_dir}
    out = subprocess.run([sys.executable, "-m", "benchmarks.cache_bench", "--child"], capture_output=True,
                         text=True, env=env, cwd=Path(__file__).parent.parent)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        a, b = child(cache_dir), child(cache_dir)
    rows = [("time to first result (s)", "first_result_s", "{:.2f}"), ("XLA compiles", "xla_compiles", "{}"),
            ("disk hits", "disk_hits", "{}"), ("compile-dependent part (s)", "compile_dependent_s", "{:.3f}"),
            ("steady-state call (ms)", "median_ms", "{:.3f}")]
    print(f"hf_llama 2-layer, input (8, 128)\n{'':28} {'A: cold':>10} {'B: warm':>10}")
    for label, key, fmt in rows:
        print(f"{label:28} {fmt.format(a[key]):>10} {fmt.format(b[key]):>10}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(measure()))
    else:
        main()
