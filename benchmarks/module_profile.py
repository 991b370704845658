"""Where a model's steady-state time goes, per submodule: eager, Inductor and backend="tpu".

    python -m benchmarks.module_profile MODEL [--depth 2] [--batch B] [--size S] [--reps 20]
                                              [--backends eager,inductor,tpu] [--top 15]

MODEL is a suite model (benchmarks/suite.py MODELS, "-bf16" for bfloat16). One eager forward
with hooks records the inputs of every submodule `--depth` levels below the model (keyword
arguments included, a KV cache argument replaced by None); each of those submodules is then
compiled alone for each backend and timed (median of --reps calls under no_grad, after
warm-up). Prints one row per submodule, the
largest tpu - inductor gaps first, and the sum of each column: a submodule that is slower on
tpu than on Inductor is where the model's gap comes from. Submodules whose compile fails show
the error's first line. Steady state only; in this process, so run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _is_kv_cache(value) -> bool:
    """A transformers KV cache: state a block appends to on every call. Timed with it, a block
    would see a longer cache each call (and recompile at each length), so it gets None instead
    and computes its full sequence as the model's forward does."""
    return hasattr(value, "get_seq_length") and hasattr(value, "update")


def capture(model, inputs, depth: int) -> list[tuple[str, object, tuple, dict]]:
    """(name, submodule, args, kwargs) of each submodule `depth` levels down, as one forward
    called it (the first call of each; later calls of a shared module are not kept)."""
    import torch

    seen: dict[str, tuple] = {}
    targets = [(name, m) for name, m in model.named_modules() if name and name.count(".") == depth - 1]
    handles = []
    for name, module in targets:
        def hook(mod, args, kwargs, name=name):
            if name not in seen:
                seen[name] = (name, mod, args, {k: None if _is_kv_cache(v) else v for k, v in kwargs.items()})
        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return [seen[name] for name, _ in targets if name in seen]


def time_module(module, args, kwargs, backend: str, reps: int) -> float:
    """Median milliseconds of module(*args, **kwargs) compiled for `backend`."""
    import torch

    fn = module if backend == "eager" else torch.compile(
        module, fullgraph=True, **({} if backend == "inductor" else {"backend": backend}))
    with torch.no_grad():
        for _ in range(3):
            fn(*args, **kwargs)
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--depth", type=int, default=2, help="submodule depth below the model (1: its children)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--backends", default="eager,inductor,tpu")
    p.add_argument("--top", type=int, default=15, help="rows printed (the largest gaps)")
    args = p.parse_args(argv)

    import torch

    from benchmarks.run import build

    torch._dynamo.config.cache_size_limit = 64  # many small modules of one class
    model, inputs = build(args.model, args.batch, args.size)
    backends = args.backends.split(",")
    rows = []
    for name, module, margs, mkwargs in capture(model, inputs, args.depth):
        row = {"module": name, "class": type(module).__name__}
        for backend in backends:
            torch._dynamo.reset()
            try:
                row[backend] = time_module(module, margs, mkwargs, backend, args.reps)
            except Exception as e:  # a submodule that does not compile alone: say why, go on
                row[backend] = None
                row.setdefault("error", f"{backend}: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}")
        rows.append(row)
    gap = (lambda r: (r.get("tpu") or 0) - (r.get("inductor") or 0)) if {"tpu", "inductor"} <= set(backends) else (
        lambda r: r.get(backends[-1]) or 0)
    rows.sort(key=gap, reverse=True)
    width = max([10, *(len(r["module"]) for r in rows)])
    print(f"{'module':{width}} {'class':24} " + " ".join(f"{b:>9}" for b in backends) + "   (ms, median)")
    for r in rows[:args.top]:
        cells = " ".join(f"{r[b]:9.3f}" if r.get(b) is not None else f"{'-':>9}" for b in backends)
        print(f"{r['module']:{width}} {r['class'][:24]:24} {cells}" + (f"   {r['error']}" if "error" in r else ""))
    sums = " ".join(f"{sum(r.get(b) or 0 for r in rows):9.3f}" for b in backends)
    print(f"{'sum of ' + str(len(rows)) + ' modules':{width}} {'':24} {sums}")
    sys.stdout.flush()
    return rows


if __name__ == "__main__":
    main()
