"""Eager tpu modes side by side: strict, defer, CPU eager and torch.compile(backend="tpu").

    python -m benchmarks.defer_bench [--cases elementwise,llama_forward,llama_train] [--size 1000]
                                     [--runs 10] [--steps 8] [--json PATH]

Cases:
  elementwise    50 iterations of y = (y + x) * 0.5 - 0.25 on a size x size tensor (float32 and
                 bfloat16), result ready at the end; median of --runs
  llama_forward  a 2-layer HF Llama (benchmarks.models.hf_llama), 2 x 16 tokens, no_grad, logits
                 ready; median of --runs
  llama_train    the same model: forward with labels, backward, AdamW, loss.item() every step;
                 --steps steps, the median of steps 4..N (wall time; cpu_ms: the process's CPU
                 time over all threads, which load on a shared machine moves less); "compiles
                 after step 3" counts XLA compiles in steps 4..N; losses compared with CPU eager
The compile column runs the forward (and its backward) through torch.compile(backend="tpu")
on tpu tensors; its optimizer step runs in strict eager. The modes take turns call by call (the
training loops run in lockstep, step k of each mode, then step k + 1), so load on a shared
machine hits them alike; each timed call runs in its own eager_mode block (leaving defer mode
runs what is pending: a call's time includes all of its work). Each mode warms up first
(programs compiled); the cache directory is a fresh temporary one unless TORCHTPU_CACHE_DIR is
set. torch's CPU threads: --threads (default 1).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

if "TORCHTPU_CACHE_DIR" not in os.environ:
    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-defer-bench-")

import torch  # noqa: E402

import torchtpu  # noqa: E402
import torchtpu.device  # noqa: E402
from benchmarks import models  # noqa: E402

MODES = ("cpu", "strict", "defer", "compile")
ITERATIONS = 50


def _device(mode: str) -> str:
    return "cpu" if mode == "cpu" else "tpu"


def _eager(mode: str):
    return torchtpu.eager_mode("defer" if mode == "defer" else "strict")


def _ready(mode: str, t: torch.Tensor) -> None:
    """Waits for `t`'s value (in defer mode: runs its pending graph first)."""
    if mode != "cpu":
        from torchtpu.device.storage import storage_of

        storage_of(t).value("benchmark").block_until_ready()


def _compiles() -> int:
    return torchtpu.stats()["xla_compiles"]


def _loop(x):
    y = x
    for _ in range(ITERATIONS):
        y = (y + x) * 0.5 - 0.25
    return y


def _round_robin(calls: dict, runs: int) -> tuple[dict, dict]:
    """Milliseconds per call of each mode and the XLA compiles during its calls, the modes
    taking turns (load on a shared machine hits them alike); each call ends with its result
    ready."""
    times, compiles = {m: [] for m in calls}, dict.fromkeys(calls, 0)
    for _ in range(runs):
        for m, fn in calls.items():
            before = _compiles()
            t0 = time.perf_counter()
            with _eager(m):
                _ready(m, fn())
            times[m].append((time.perf_counter() - t0) * 1e3)
            compiles[m] += _compiles() - before
    return times, compiles


def _measure(make: dict, runs: int) -> dict:
    """make: mode -> (call, its result's max error). Warms every mode up (3 calls: programs
    compiled), then times them in turns."""
    calls = {m: f for m, (f, _) in make.items()}
    _round_robin(calls, 3)
    times, compiles = _round_robin(calls, runs)
    return {m: {"ms": statistics.median(times[m]), "best_ms": min(times[m]), "compiles_after_warmup": compiles[m],
                "max_error": error()} for m, (_, error) in make.items()}


def elementwise(modes, dtype: torch.dtype, size: int, runs: int) -> dict:
    torch.manual_seed(0)
    host = torch.randn(size, size).to(dtype)
    expected = _loop(host.float())
    compiled = torch.compile(_loop, backend="tpu", fullgraph=True)
    make = {}
    for m in modes:
        x = host.to(_device(m))
        fn = compiled if m == "compile" else _loop
        box = {}

        def call(fn=fn, x=x, box=box):
            box["y"] = fn(x)
            return box["y"]

        def error(box=box):
            return (box["y"].cpu().float() - expected).abs().max().item()

        make[m] = (call, error)
    return _measure(make, runs)


def llama_forward(modes, runs: int) -> dict:
    torch.manual_seed(0)
    cpu = models.hf_llama()
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = cpu(ids).logits
    make = {}
    for m in modes:
        model = copy.deepcopy(cpu).to(_device(m))
        fn = torch.compile(model, backend="tpu", fullgraph=True) if m == "compile" else model
        x, box = ids.to(_device(m)), {}

        def call(fn=fn, x=x, box=box):
            with torch.no_grad():
                box["y"] = fn(x).logits
            return box["y"]

        def error(box=box):
            return (box["y"].cpu() - expected).abs().max().item()

        make[m] = (call, error)
    return _measure(make, runs)


class _Training:
    """One mode's copy of the model, its AdamW, and its step."""

    def __init__(self, mode: str, cpu_model, ids):
        self.mode = mode
        self.model = copy.deepcopy(cpu_model).train().to(_device(mode))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.forward = torch.compile(self.model, backend="tpu", fullgraph=True) if mode == "compile" else self.model
        self.ids = ids.to(_device(mode))
        self.times, self.cpu_times, self.losses, self.compiles = [], [], [], []

    def step(self) -> None:
        before = _compiles()
        t0, c0 = time.perf_counter(), time.process_time()
        with _eager(self.mode):
            self.optimizer.zero_grad()
            loss = self.forward(self.ids, labels=self.ids).loss
            loss.backward()
            self.optimizer.step()
            self.losses.append(loss.item())
        self.times.append((time.perf_counter() - t0) * 1e3)
        self.cpu_times.append((time.process_time() - c0) * 1e3)
        self.compiles.append(_compiles() - before)


def llama_train(modes, steps: int) -> dict:
    """The modes' training loops in lockstep: step k of every mode, then step k + 1."""
    torch.manual_seed(0)
    cpu = models.hf_llama()
    ids = torch.randint(0, 256, (2, 16))
    loops = {m: _Training(m, cpu, ids) for m in dict.fromkeys(["cpu", *modes])}
    for _ in range(steps):
        for loop in loops.values():
            loop.step()
    reference = loops["cpu"].losses
    return {m: {"ms": statistics.median(t.times[3:]), "best_ms": min(t.times[3:]),
                "cpu_ms": statistics.median(t.cpu_times[3:]),
                "compiles_after_step_3": sum(t.compiles[3:]), "first_step_ms": round(t.times[0], 1),
                "max_loss_diff": max(abs(a - b) for a, b in zip(t.losses, reference)), "losses": t.losses}
            for m, t in loops.items() if m in modes}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="elementwise,llama_forward,llama_train")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (CPU eager; default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cases, modes = args.cases.split(","), args.modes.split(",")
    results: dict = {}
    rows = []
    if "elementwise" in cases:
        for dtype in (torch.float32, torch.bfloat16):
            name = f"elementwise {str(dtype)[6:]} {args.size}x{args.size}"
            results[name] = elementwise(modes, dtype, args.size, args.runs)
            rows.append(name)
    if "llama_forward" in cases:
        results["llama forward"] = llama_forward(modes, args.runs)
        rows.append("llama forward")
    if "llama_train" in cases:
        results["llama train step"] = llama_train(modes, args.steps)
        rows.append("llama train step")
    print(f"{'case':<28}" + "".join(f"{m + ' ms':>12}" for m in modes) + f"{'strict/defer':>14}")
    for name in rows:
        r = results[name]
        speedup = r["strict"]["ms"] / r["defer"]["ms"] if "strict" in r and "defer" in r else float("nan")
        print(f"{name:<28}" + "".join(f"{r[m]['ms']:>12.2f}" for m in modes) + f"{speedup:>13.2f}x")
    for name in rows:
        for m, r in results[name].items():
            extra = {k: (round(v, 7) if isinstance(v, float) else v) for k, v in r.items() if k not in ("ms", "losses")}
            print(f"  {name} [{m}]: {extra}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"results": results, "argv": sys.argv[1:], "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
