"""Steady state of eager, Inductor and backend="tpu" side by side: one process per model, calls alternated.

    python -m benchmarks.side [--models hf_llama,cnn,...] [--train] [--threads 1]
                              [--rounds 5] [--calls 20] [--out benchmarks/results/side.json]

The suite (benchmarks/suite.py) runs each (model, backend) cell in a fresh process, one cell after
another, because a cold start and a peak resident set need a process of their own. Its
steady-state ratios then divide two times taken minutes apart, and on a shared VM the load moves
in between: on the 2-core VM one cell's median moved ±30% from one run to the next (eager's CNN
17.6 ms in one run, 51.5 ms in the next), more than most of the gaps it is meant to show.

Here each model gets one fresh process (empty compile caches). Every backend is compiled in it and
its output checked against eager's; then each of `--rounds` rounds times `--calls` calls (under
no_grad) or, with `--train`, training steps (the suite's compiled loss, its backward and an AdamW
step of the backend's own) of every backend in turn, the order reversed every other round. A
backend's time is the median of its round medians, so every ratio compares times taken seconds
apart, under the same load. Steady state only: first calls and memory stay the suite's.
One process holds every backend's threads: Inductor's and eager's OpenMP team and XLA's pool
take turns on the cores rather than running side by side (a round times one backend at a time).

`--threads 1` gives the process one torch thread and one XLA thread, as the suite's `--threads 1`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

BACKENDS = ("eager", "inductor", "tpu")


def measure(model_name: str, backends: list[str], rounds: int, calls: int, train: bool,
            batch: int | None = None, size: int | None = None) -> dict:
    """One model's backends in this process: compiled, checked (inference), then timed in
    alternating rounds. Returns {"model", "median_ms": {backend: ms}, "rounds_ms": {backend:
    [per-round medians]}, "max_abs_err": {backend: error against eager} (inference only)}."""
    import torch

    from benchmarks.cells import compile_for, max_abs_err, target_for, train_loss
    from benchmarks.run import build
    from benchmarks.timing import median_ms

    model, inputs = build(model_name, batch, size)
    runs, errors = {}, {}
    if train:
        model.train()
        args = (model, *inputs, target_for(model_name, model, inputs))
        for backend in backends:
            runs[backend] = _step(compile_for(train_loss, backend), args, torch.optim.AdamW(model.parameters(), lr=1e-4))
    else:
        with torch.no_grad():
            expected = model(*inputs)
            for backend in backends:
                fn = compile_for(model, backend)
                runs[backend] = _call(fn, inputs)
                if backend != "eager":
                    errors[backend] = max_abs_err(fn(*inputs), expected)
    samples = {backend: [] for backend in runs}
    with contextlib.nullcontext() if train else torch.no_grad():
        for r in range(rounds):
            order = list(runs.items())
            for backend, run in (order if r % 2 == 0 else order[::-1]):
                samples[backend].append(median_ms(run, warmup=3, runs=calls))
    return {"model": model_name, "median_ms": {b: statistics.median(v) for b, v in samples.items()},
            "rounds_ms": samples, "max_abs_err": errors}


def _call(fn, inputs):
    return lambda: fn(*inputs)


def _step(loss_fn, args: tuple, opt):
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(*args).backward()
        opt.step()
    return step


def ratios(row: dict) -> dict:
    """tpu/inductor and tpu/eager of one model's medians (where both columns were measured)."""
    ms = row.get("median_ms", {})
    return {f"tpu/{other}": ms["tpu"] / ms[other] for other in ("inductor", "eager") if "tpu" in ms and other in ms}


def table(rows: list[dict], backends: list[str], heading: str) -> str:
    """The printed table: one line per model, then the geomean of each ratio."""
    from benchmarks.report import geomean

    names = [f"tpu/{b}" for b in ("inductor", "eager") if b in backends and "tpu" in backends]
    lines = [heading, "| model | " + " | ".join(f"{b} ms" for b in backends) + " | " + " | ".join(names) + " |",
             "|---" * (1 + len(backends) + len(names)) + "|"]
    per_ratio = {n: [] for n in names}
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error']} |")
            continue
        r = ratios(row)
        for n in names:
            per_ratio[n].append(r[n])
        lines.append(f"| {row['model']} | " + " | ".join(f"{row['median_ms'][b]:.2f}" for b in backends) + " | "
                     + " | ".join(f"{r[n]:.2f}x" for n in names) + " |")
    lines.append("| geomean | " + " | ".join("" for _ in backends) + " | "
                 + " | ".join(f"**{geomean(v):.2f}x**" if v else "-" for v in per_ratio.values()) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    from benchmarks import suite

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(suite.MODELS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--train", action="store_true", help="time training steps instead of inference calls")
    p.add_argument("--threads", type=int, choices=[1], default=None,
                   help="one torch thread and one XLA thread; default: the libraries' own")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20, help="timed calls (or steps) per backend per round")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per model's process")
    p.add_argument("--out", default=None, help="write the result here (JSON)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one model, in this process
    args = p.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if args.child:
        if os.environ.get("TORCHTPU_BENCH_THREADS"):
            import torch
            torch.set_num_threads(int(os.environ["TORCHTPU_BENCH_THREADS"]))
        row = measure(args.child, backends, args.rounds, args.calls, args.train, args.batch, args.size)
        print(json.dumps(row))
        return row

    from benchmarks import report
    from benchmarks.generate_bench import single_thread_env
    from benchmarks.run import cache_env, run_fresh

    load_before = report.load_average()
    rows = []
    passthrough = ["--backends", args.backends, "--rounds", str(args.rounds), "--calls", str(args.calls)]
    passthrough += ["--train"] if args.train else []
    passthrough += ["--batch", str(args.batch)] if args.batch else []
    passthrough += ["--size", str(args.size)] if args.size else []
    with tempfile.TemporaryDirectory(prefix="torchtpu-side-") as root:
        for model_name in [m for m in args.models.split(",") if m]:
            env = cache_env(root, model_name)
            env = single_thread_env(env) if args.threads == 1 else env
            t0 = time.perf_counter()
            row = run_fresh(["-m", "benchmarks.side", "--child", model_name, *passthrough], env, args.timeout)
            row.setdefault("model", model_name)
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            shown = "error: " + row["error"] if "error" in row else "  ".join(
                f"{b} {ms:.2f} ms" for b, ms in row["median_ms"].items())
            print(f"  {model_name:14s} {shown}  ({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    threads = "one thread" if args.threads == 1 else "default threads"
    what = "training steps" if args.train else "inference calls"
    heading = (f"Side by side, one process per model, {threads}, {args.rounds} alternated rounds of {args.calls} "
               f"{what} (ms, median of round medians)")
    text = table(rows, backends, heading)
    print(text)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": report.machine(), "source": report.source_version(),
           "load_average": {"before": load_before, "after": report.load_average()},
           "args": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows, "table": text}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return doc


if __name__ == "__main__":
    main()
