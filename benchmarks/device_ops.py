"""Per-op dispatch cost on the eager tpu device, beside CPU eager: small ops on 16 floats.

    python -m benchmarks.device_ops [--calls 2000] [--rounds 7] [--modes strict,defer] [--json PATH]

For each case and column (CPU eager, tpu strict, tpu defer) it times `--calls` calls in a row,
`--rounds` times, the columns taking turns round by round (load on a shared machine hits them
alike), and prints the median and the best round in µs per call. Programs are compiled before
timing (a warm-up round). Cases:
  add         c = a + b (returns once the program is launched; defer: recorded)
  add_ready   c = a + b, then waits for c's value (defer: runs the pending op first)
  add_        a.add_(b), in place
  mul_number  a * 0.5 (a runtime number: one program for every value)
  sum_item    (a + b).sum().item(): two ops and a download
The defer column leaves each round's pending ops to the round's end (one flush per round, as a
loop of small ops would); `add_ready` flushes at every call. torch runs on one thread
(CPU eager's column); the device's programs are XLA's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

if "TORCHTPU_CACHE_DIR" not in os.environ:
    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-device-ops-")

import torch  # noqa: E402

import torchtpu  # noqa: E402
import torchtpu.device  # noqa: E402
from torchtpu.device.storage import storage_of  # noqa: E402

NUMEL = 16


def _ready(t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        storage_of(t).value("benchmark").block_until_ready()


def cases(device: str) -> dict:
    """name -> a zero-argument call on fresh 16-float operands on `device`."""
    a, b = torch.randn(NUMEL, device=device), torch.randn(NUMEL, device=device)

    def add_ready():
        _ready(a + b)

    return {"add": lambda: a + b, "add_ready": add_ready, "add_": lambda: a.add_(b),
            "mul_number": lambda: a * 0.5, "sum_item": lambda: (a + b).sum().item()}


def _round(fn, calls: int, mode: str | None) -> float:
    """µs per call over `calls` calls (the defer mode's pending ops run inside the round)."""
    if mode is None:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls * 1e6
    with torchtpu.eager_mode(mode):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torchtpu.sync()
        return (time.perf_counter() - t0) / calls * 1e6


def measure(modes: list[str], calls: int, rounds: int) -> dict:
    """{case: {column: {"median_us", "best_us"}}}; columns "cpu" and each mode."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        columns = {"cpu": (cases("cpu"), None), **{m: (cases("tpu"), m) for m in modes}}
        names = list(columns["cpu"][0])
        samples = {n: {c: [] for c in columns} for n in names}
        for name in names:
            for fns, mode in columns.values():
                _round(fns[name], max(calls // 10, 10), mode)  # warm-up: programs compiled
            for _ in range(rounds):
                for column, (fns, mode) in columns.items():
                    samples[name][column].append(_round(fns[name], calls, mode))
    finally:
        torch.set_num_threads(threads)
    return {n: {c: {"median_us": statistics.median(v), "best_us": min(v)} for c, v in cols.items()}
            for n, cols in samples.items()}


def table(results: dict) -> str:
    columns = list(next(iter(results.values())))
    lines = [f"{'case':12} " + " ".join(f"{c + ' us':>18}" for c in columns) + "   (median / best round)"]
    for name, cols in results.items():
        lines.append(f"{name:12} " + " ".join(f"{v['median_us']:9.1f} / {v['best_us']:6.1f}" for v in cols.values()))
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--modes", default="strict,defer")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    results = measure(args.modes.split(","), args.calls, args.rounds)
    print(table(results))
    print(f"load average {[round(x, 2) for x in os.getloadavg()]}; {NUMEL} float32; torch threads 1")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
