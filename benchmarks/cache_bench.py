"""Cold, warm-cache and precompiled starts, side by side with Inductor's cold and warm, for a 2-layer HF Llama.

Each column is a fresh process:
  tpu cold         torch.compile(backend="tpu") with an empty TORCHTPU_CACHE_DIR
  tpu warm         the same, with the cache the cold process left (no XLA compile; still traces)
  tpu precompiled  torchtpu.precompile.load of an artifact a separate process saved (no tracing)
  inductor cold    torch.compile (Inductor) with an empty TORCHINDUCTOR_CACHE_DIR
  inductor warm    the same, with the cache the cold process left

    python -m benchmarks.cache_bench [--model hf_llama|hf_bert|decoder] [--batch 8 --size 128] [--skip-inductor] [--train]

--train measures a training step instead (the model's loss compiled, then backward: the
precompiled artifact carries the backward graph too; the AdamW update is eager and not timed).

Prints seconds from the process's launch to the first result (imports and building the model
included) and from the compile (or load) call to the first result (torch, torchtpu and its
precompile API already imported, the model built); XLA compiles; Dynamo graphs;
the median steady-state call in ms. Inductor needs a C++ compiler; it runs at the default
thread settings, as ours does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent


def measure(mode: str, model_name: str, artifact: str | None, batch: int | None = None, size: int | None = None,
            train: bool = False) -> dict:
    import contextlib
    import warnings

    import torch

    import torchtpu
    from benchmarks.cells import target_for, train_loss
    from benchmarks.run import build
    from benchmarks.timing import median_ms

    warnings.filterwarnings("ignore")
    model, inputs = build(model_name, batch, size)
    fn, args = model, inputs
    if train:  # the loss of the model's output, the model an argument (a precompiled function's artifact)
        model.train()
        fn, args = train_loss, (model, *inputs, target_for(model_name, model, inputs))
    import torchtpu.precompile.api  # noqa: F401  (part of importing torchtpu: timed neither way)

    def run_once(f):
        out = f(*args)
        if train:
            out.backward()
            model.zero_grad(set_to_none=True)
    with contextlib.nullcontext() if train else torch.no_grad():
        if mode == "save":
            torchtpu.precompile.save(fn, args if train else inputs, artifact)
            return {}
        t0 = time.perf_counter()
        if mode == "precompiled":
            compiled = torchtpu.precompile.load(artifact, None if train else model)
        else:
            compiled = torch.compile(fn, backend="tpu" if mode == "tpu" else "inductor", fullgraph=True)
        run_once(compiled)
        first = time.perf_counter()
        ms = median_ms(lambda: run_once(compiled), warmup=3, runs=30)
    s = torchtpu.stats()
    return {"since_launch_s": first - float(os.environ["BENCH_LAUNCHED"]) + _clock_offset(),
            "first_result_s": first - t0, "xla_compiles": s["xla_compiles"], "dynamo_graphs": _dynamo_graphs(),
            "median_ms": ms}


def _clock_offset() -> float:
    """perf_counter -> wall clock (the parent stamps its launch time with time.time())."""
    return time.time() - time.perf_counter()


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["stats"].get(k, 0) for k in ("unique_graphs",)))


def child(mode: str, model_name: str, env: dict, artifact: str | None = None, shape: tuple = (),
          train: bool = False) -> dict:
    env = {**os.environ, **env, "BENCH_LAUNCHED": repr(time.time())}
    cmd = [sys.executable, "-m", "benchmarks.cache_bench", "--child", mode, "--model", model_name]
    cmd += ["--train"] if train else []
    if shape:
        cmd += ["--batch", str(shape[0]), "--size", str(shape[1])]
    if artifact:
        cmd += ["--artifact", artifact]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{mode}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hf_llama")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--skip-inductor", action="store_true")
    parser.add_argument("--train", action="store_true", help="a training step (loss and backward) instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.model, args.artifact, args.batch, args.size, args.train)))
        return
    columns, shape = {}, (args.batch, args.size)
    with tempfile.TemporaryDirectory() as tmp:
        tpu_env = {"TORCHTPU_CACHE_DIR": f"{tmp}/tpu", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor-for-tpu"}
        columns["tpu cold"] = child("tpu", args.model, tpu_env, shape=shape, train=args.train)
        columns["tpu warm"] = child("tpu", args.model, tpu_env, shape=shape, train=args.train)
        artifact = f"{tmp}/model.tpu-precompiled"
        child("save", args.model, tpu_env, artifact, shape, args.train)
        columns["tpu precompiled"] = child("precompiled", args.model, tpu_env, artifact, shape, args.train)
        if not args.skip_inductor:
            inductor_env = {"TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor"}
            columns["inductor cold"] = child("inductor", args.model, inductor_env, shape=shape, train=args.train)
            columns["inductor warm"] = child("inductor", args.model, inductor_env, shape=shape, train=args.train)
    rows = [("launch to first result (s)", "since_launch_s", "{:.2f}"),
            ("compile/load to first result (s)", "first_result_s", "{:.3f}"),
            ("XLA compiles", "xla_compiles", "{}"), ("Dynamo graphs", "dynamo_graphs", "{}"),
            ("steady-state call (ms)", "median_ms", "{:.3f}")]
    threads = os.environ.get("OMP_NUM_THREADS", "default")
    print(f"{args.model} 2-layer, batch {args.batch} x {args.size} tokens, "
          f"{'training step (loss + backward)' if args.train else 'no_grad'}, threads: {threads}, "
          f"{os.cpu_count()} cores")
    print(f"{'':34}" + "".join(f"{name:>17}" for name in columns))
    for label, key, fmt in rows:
        print(f"{label:34}" + "".join(f"{fmt.format(c[key]):>17}" for c in columns.values()))


if __name__ == "__main__":
    main()
