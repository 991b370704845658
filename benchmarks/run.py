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
BF16 = "-bf16"  # a model name's suffix: that model in bfloat16


def build(name: str, batch: int | None = None, size: int | None = None):
    """One benchmark model (random weights, seed 0) and its inputs.

    Args:
        name: one of MODELS or benchmarks/families.py's FAMILIES; with the suffix "-bf16", the
            model and its floating-point inputs in bfloat16.
        batch: the batch size (default: 64 for mlp, 32 for cnn, 8 for the rest).
        size: the sequence length of the token models, the image side of the CNN (default 128,
            64 for the CNN; its adaptive pooling takes any side >= 8).
    Returns:
        (model in eval mode, tuple of inputs).
    """
    import torch

    from benchmarks import models

    if name.endswith(BF16):  # the same model and inputs in bfloat16 (integer inputs stay as they are)
        model, inputs = build(name.removesuffix(BF16), batch, size)
        return model.to(torch.bfloat16), tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    torch.manual_seed(0)
    if name == "mlp":
        return models.MLP(256, 1024, 256).eval(), (torch.randn(batch or 64, 256),)
    if name == "cnn":
        return models.CNN().eval(), (torch.randn(batch or 32, 3, size or 64, size or 64),)
    tokens = (batch or 8, size or 128)
    if name == "decoder":
        return models.TinyDecoder(vocab=512, dim=128, heads=4, layers=2, max_len=max(128, tokens[1])).eval(), (
            torch.randint(0, 512, tokens),)
    if name == "hf_llama":
        return models.hf_llama(layers=2, vocab=1024, hidden=128), (torch.randint(0, 1024, tokens),)
    if name == "hf_bert":
        return models.hf_bert(layers=2, vocab=1024, hidden=128), (torch.randint(0, 1024, tokens),)
    from benchmarks.families import FAMILIES

    if name in FAMILIES:
        builder = FAMILIES[name][0]
        return builder(**{k: v for k, v in (("batch", batch), ("size", size)) if v is not None})
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


def cache_env(cache_root: str, tag: str, caches_on: bool = False) -> dict:
    """The environment of a fresh child whose Inductor and torchtpu caches live under cache_root.

    Args:
        cache_root: a folder this run owns (a temporary directory).
        tag: names the cell's two cache folders, so cells never share a cache by accident.
        caches_on: keep Inductor's FX-graph and AOTAutograd caches on (a later process given
            the same tag then starts warm); off measures a cold compile even on a rerun.
    Returns:
        A copy of os.environ with the cache variables set.
    """
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, f"inductor-{tag}")
    env["TORCHTPU_CACHE_DIR"] = os.path.join(cache_root, f"torchtpu-{tag}")
    if not caches_on:
        env["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
        env["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    return env


def run_fresh(argv: list[str], env: dict, timeout_s: float | None = None) -> dict:
    """Runs `python ARGV...` in a fresh process and returns the JSON object on its last stdout line.

    Args:
        argv: the interpreter's arguments, e.g. ["-m", "benchmarks.run", "--child", "mlp", "tpu"].
        env: the child's whole environment (see cache_env).
        timeout_s: kill the child after this many seconds.
    Returns:
        The child's JSON object, or {"error": last stderr line} when it failed or timed out.
    """
    cmd = [sys.executable, *argv]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                             cwd=Path(__file__).parent.parent)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or [f"exit code {out.returncode}"]
        return {"error": lines[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_child(model_name: str, backend: str, cache_root: str) -> dict:
    env = cache_env(cache_root, model_name)
    row = run_fresh(["-m", "benchmarks.run", "--child", model_name, backend], env)
    return row if "error" not in row else {"model": model_name, "backend": backend, "error": [row["error"]]}


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
