"""Where a cold process's memory goes, phase by phase: the tpu backend's start against eager's.

    python -m benchmarks.memory_phases [--models hf_llama,cnn,...] [--workload infer|train] [--out JSON]

The suite's "peak RSS beyond the floor" rows give one number per cell. This splits the tpu
cell's into the phases a cold `torch.compile(model, backend="tpu")` process goes through, in
this order, each in a fresh process with empty caches:

    torch          `import torch` (eager's floor)
    runtime        torchtpu imported and the PJRT client up (the suite's tpu floor)
    XLA compiler   the first XLA program lowered and compiled (`x * 2 + 1`) as the backend
                   does: in the compiler process where that is on (torchtpu/compiler/worker.py;
                   this process lowers and loads, +45 MB of JAX's lowering and code pages),
                   else here, where XLA's compiler state is made as well; once per process
    torch.compile  Dynamo and AOTAutograd imported and a first tiny graph compiled through the
                   backend: torch's compile stack, also once per process (Inductor pays it too)
    model          the model built (its library imported; eager pays this as well)
    first call     the model compiled and called once (`--workload train`: one training step,
                   forward and loss compiled, then backward and AdamW): tracing, lowering and
                   XLA's compiles
    steady         ten more calls

Each phase records the resident set after it (VmRSS) and the high-water mark (VmHWM): a phase
whose peak is above the next phase's resident set freed what it used (the compile's peak). The
eager column is a process that imports torch, builds the model and calls it. Numbers are MB.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.cells import status_kb

TPU_PHASES = ["torch", "runtime", "XLA compiler", "torch.compile", "model", "first call", "steady"]
EAGER_PHASES = ["torch", "model", "first call", "steady"]
STEADY_CALLS = 10


def memory_mb() -> dict:
    """{"rss": VmRSS, "hwm": VmHWM} of this process in MB."""
    kb = status_kb("VmRSS", "VmHWM")
    return {"rss": kb["VmRSS"] / 1024, "hwm": kb["VmHWM"] / 1024}

def child(model_name: str, backend: str, workload: str = "infer") -> dict:
    """Runs the phases in this process: {"phases": [{"phase", "rss", "hwm"}, ...], ...}."""
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    phases = [{"phase": "torch", **memory_mb()}]

    def mark(name: str) -> None:
        phases.append({"phase": name, **memory_mb()})

    compiles = None
    if backend == "tpu":
        import jax
        import jax.numpy as jnp

        from torchtpu import counters
        from torchtpu.runtime import platform

        platform.device()
        mark("runtime")
        from torchtpu.compiler import worker

        lowered = jax.jit(lambda x: x * 2 + 1).lower(jnp.ones(16))
        worker.enable()
        worker.compile(lowered, None) if worker.use() else lowered.compile()
        mark("XLA compiler")
        torch.compile(lambda t: t * 2 + 1, backend="tpu", fullgraph=True)(torch.ones(16))
        mark("torch.compile")
        compiles = counters.stats()["xla_compiles"]
    step = _step(model_name, backend, workload)
    mark("model")
    step()
    mark("first call")
    for _ in range(STEADY_CALLS):
        step()
    mark("steady")
    result = {"model": model_name, "backend": backend, "workload": workload, "phases": phases}
    if compiles is not None:  # the model's own XLA compiles (a cache hit would not be a cold start)
        result["model_xla_compiles"] = counters.stats()["xla_compiles"] - compiles
    return result


def _step(model_name: str, backend: str, workload: str):
    """The model built, and one call of it as a zero-argument function: a no-grad forward
    ("infer"), or the suite's training step (forward and loss compiled, backward, AdamW)."""
    import torch

    from benchmarks.cells import target_for, train_loss
    from benchmarks.run import build

    model, inputs = build(model_name)
    compiled = (lambda f: f) if backend == "eager" else (
        lambda f: torch.compile(f, backend=backend, fullgraph=True))
    if workload == "infer":
        fn = compiled(model)

        def call():
            with torch.no_grad():
                fn(*inputs)
        return call
    model.train()
    args = (model, *inputs, target_for(model_name, model, inputs))
    opt, fn = torch.optim.AdamW(model.parameters(), lr=1e-4), compiled(train_loss)

    def train_step():
        opt.zero_grad(set_to_none=True)
        fn(*args).backward()
        opt.step()
    return train_step


def run(models: list[str], workload: str = "infer") -> list[dict]:
    """One fresh process per model and backend (eager, tpu), each with empty caches."""
    from benchmarks.run import cache_env, run_fresh

    rows = []
    with tempfile.TemporaryDirectory(prefix="torchtpu-memory-") as root:
        for model in models:
            for backend in ("eager", "tpu"):
                row = run_fresh(["-m", "benchmarks.memory_phases", "--child", model, backend, workload],
                                cache_env(root, f"{model}-{backend}"))
                print(f"  {model:12} {backend:6} {row.get('error', 'ok')}", file=sys.stderr)
                rows.append({"model": model, "backend": backend, "workload": workload, **row})
    return rows


def summary(row: dict) -> dict:
    """A tpu row's phases as MB beyond its runtime floor: the fixed part (XLA's compiler and
    torch's compile stack), the model, the first call's peak above the model, and the peak."""
    at = {p["phase"]: p for p in row["phases"]}
    floor = at["runtime"]["rss"]
    return {"fixed": at["torch.compile"]["rss"] - floor,
            "model": at["model"]["rss"] - at["torch.compile"]["rss"],
            "compile peak": at["first call"]["hwm"] - at["model"]["rss"],
            "kept after": at["steady"]["rss"] - at["model"]["rss"],
            "peak beyond floor": at["steady"]["hwm"] - floor}


def format_table(rows: list[dict]) -> str:
    """Per model and backend: the resident set and high-water mark after each phase (MB), then the
    tpu process's peak beyond its floor split into what every process pays and what the model adds."""
    ok = [r for r in rows if "phases" in r]
    models = list(dict.fromkeys(r["model"] for r in ok))
    by = {(r["model"], r["backend"]): {p["phase"]: p for p in r["phases"]} for r in ok}
    lines = [" | ".join(["MB: rss / peak after".ljust(20)] + [p.rjust(13) for p in TPU_PHASES])]
    for m in models:
        for b in ("eager", "tpu"):
            at = by.get((m, b), {})
            cells = [f"{m} {b}".ljust(20)]
            cells += [(f"{at[p]['rss']:.0f} / {at[p]['hwm']:.0f}" if p in at else "-").rjust(13) for p in TPU_PHASES]
            lines.append(" | ".join(cells))
    lines.append("")
    lines.append("tpu beyond its floor (MB) | fixed (XLA compiler + torch.compile) | model | compile peak | "
                 "kept after | peak beyond floor | eager's peak beyond torch")
    for m in models:
        tpu, eager = by.get((m, "tpu")), by.get((m, "eager"))
        if not tpu or not eager:
            continue
        s = summary({"phases": list(tpu.values())})
        eager_beyond = eager["steady"]["hwm"] - eager["torch"]["rss"]
        lines.append(f"{m:25} | {s['fixed']:36.0f} | {s['model']:5.0f} | {s['compile peak']:12.0f} | "
                     f"{s['kept after']:10.0f} | {s['peak beyond floor']:17.0f} | {eager_beyond:.0f}")
    for r in rows:
        if "error" in r:
            lines.append(f"error: {r['model']} {r['backend']}: {r['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="hf_llama,hf_bert,hf_t5,cnn,unet", help="comma-separated suite models")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    p.add_argument("--workload", choices=["infer", "train"], default="infer",
                   help="a no-grad forward, or the suite's training step (forward and loss compiled)")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "BACKEND", "WORKLOAD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    rows = run(args.models.split(","), args.workload)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print(format_table(rows))


if __name__ == "__main__":
    main()
