"""Side-by-side benchmark: eager vs Inductor vs backend="tpu".

Each (model, backend) runs in a fresh process, so first-call times include everything a
user waits for (Dynamo, AOTAutograd, compilation) and no cache from an earlier run (the
Inductor and torchtpu on-disk caches are pointed at an empty folder).

    python -m benchmarks.run [--models mlp,cnn,...] [--json benchmarks/results/run.json]

Prints: model | eager ms | inductor ms | tpu ms | tpu first-call s | inductor first-call s
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = ["mlp", "cnn", "decoder", "hf_llama", "hf_bert"]
BACKENDS = ["eager", "inductor", "tpu"]


def build(name: str):
    import torch

    from benchmarks import models

    torch.manual_seed(0)
    if name == "mlp":
        return models.MLP(256, 1024, 256).eval(), (torch.randn(64, 256),)
    if name == "cnn":
        return models.CNN().eval(), (torch.randn(32, 3, 64, 64),)
    if name == "decoder":
        return models.TinyDecoder(vocab=512, dim=128, heads=4, layers=2, max_len=128).eval(), (
            torch.randint(0, 512, (8, 128)),)
    if name == "hf_llama":
        return models.hf_llama(layers=2, vocab=1024, hidden=128), (torch.randint(0, 1024, (8, 128)),)
    if name == "hf_bert":
        return models.hf_bert(layers=2, vocab=1024, hidden=128), (torch.randint(0, 1024, (8, 128)),)
    raise SystemExit(f"unknown model {name}")


def measure(model_name: str, backend: str) -> dict:
    """Runs in a child process: first call and steady-state latency of one model/backend."""
    import time
    import warnings

    import torch

    from benchmarks.timing import median_ms

    warnings.filterwarnings("ignore")
    model, inputs = build(model_name)
    fn = model if backend == "eager" else torch.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(*inputs)
        first = time.perf_counter() - t0
        ms = median_ms(lambda: fn(*inputs), warmup=3, runs=30)
    return {"model": model_name, "backend": backend, "first_call_s": first, "median_ms": ms}


def run_child(model_name: str, backend: str, cache_root: str) -> dict:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, f"inductor-{model_name}")
    env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    env["TORCHTPU_CACHE_DIR"] = os.path.join(cache_root, f"torchtpu-{model_name}")
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", model_name, backend]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).parent.parent)
    if out.returncode != 0:
        return {"model": model_name, "backend": backend, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    by = {(r["model"], r["backend"]): r for r in rows}
    head = f"{'model':10} | {'eager ms':>9} | {'inductor ms':>11} | {'tpu ms':>8} | {'tpu/eager':>9} | " \
           f"{'tpu/ind':>7} | {'tpu first-call s':>16} | {'inductor first-call s':>21}"
    lines = [head, "-" * len(head)]
    for m in dict.fromkeys(r["model"] for r in rows):
        e, i, t = (by.get((m, b), {}) for b in BACKENDS)
        def ms(r):
            return f"{r['median_ms']:.2f}" if "median_ms" in r else "error"
        def s(r):
            return f"{r['first_call_s']:.2f}" if "first_call_s" in r else "error"
        def ratio(a, b):
            return f"{a['median_ms'] / b['median_ms']:.2f}" if "median_ms" in a and "median_ms" in b else "-"
        lines.append(f"{m:10} | {ms(e):>9} | {ms(i):>11} | {ms(t):>8} | {ratio(t, e):>9} | {ratio(t, i):>7} | "
                     f"{s(t):>16} | {s(i):>21}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--json", default="benchmarks/results/run.json")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="torchtpu-bench-") as cache_root:
        for model_name in args.models.split(","):
            for backend in args.backends.split(","):
                row = run_child(model_name, backend, cache_root)
                print(f"  {model_name:10} {backend:9} {row}", file=sys.stderr, flush=True)
                rows.append(row)
    print(table(rows))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
