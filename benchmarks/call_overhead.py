"""Per-call cost of the tiny compiled graph `x * 2 + 1` on 16 floats, tpu vs Inductor vs eager,
and where the tpu call's time goes.

    python -m benchmarks.call_overhead [--threads both|default|1] [--rounds 9] [--calls 3000]
                                       [--numel 16]

`--numel 4096` times the suite's "small" graph instead: above PJRT's cheap-computation bound,
so the CPU client hands the program to a worker thread, and `execute` holds that handoff.

Each thread setting runs in a fresh process with empty compile caches (XLA reads XLA_FLAGS when
its client starts); `--threads 1` is one torch thread and one XLA thread
(generate_bench.single_thread_env). Inside a process every column is timed in the same
interleaved rounds of `--calls` calls; a round's value is its mean per call, in wall time and
in the process's CPU time (on a shared machine wall time swings with the other load, CPU time
much less). The table gives the min and the median over rounds.

The breakdown times each step of a call by calling that step alone, on the objects the call
uses, in the same rounds:
    frame        Dynamo's frame and guards alone: the same function compiled by a backend whose
                 callable returns a kept tensor
    frame extra  the whole call minus the backend's callable minus `frame`: what Dynamo's part
                 costs more with this callable inside it than with the trivial one (the callable's
                 footprint in the caches, measured; see docs/benchmarks.md)
    call path    tpu: the callable minus Executable.run (runtime/lean.py, CompiledGraph)
    inputs       torch tensors -> PJRT buffers (DLPack, zero copy): transfer.host_arrays on
                 Executable.run's host path (`plain_host`), else Executable.input_arrays
    execute      PJRT's execute_sharded
    results      Executable.execute minus execute_sharded: the results as device arrays
    outputs      device arrays -> torch tensors (DLPack, zero copy): transfer.from_cpu_buffer per
                 result on the host path, else Executable.outputs
    run glue     Executable.run minus inputs, execute, results and outputs
    callable     inductor: the callable compile_fx handed Dynamo (AOTAutograd's wrapper and
                 the generated kernel)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

TINY_NUMEL = 16  # the default of --numel
TPU_STEPS = ["frame", "frame extra", "call path", "inputs", "execute", "results", "outputs", "run glue"]
INDUCTOR_STEPS = ["frame", "frame extra", "callable"]


def tiny(t):
    return t * 2 + 1


def _timed(fn, calls: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per call of fn, the mean over `calls` calls."""
    c0, w0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - w0) / calls / 1e3, (time.process_time_ns() - c0) / calls / 1e3


def measure(rounds: int, calls: int, numel: int = TINY_NUMEL) -> dict:
    """Interleaved rounds in this process: {column: {"wall": [µs per round], "cpu": [...]}}."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    from torchtpu.backend import tpu_backend
    from torchtpu.runtime import transfer

    if os.environ.get("TORCHTPU_BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["TORCHTPU_BENCH_THREADS"]))
    x = torch.randn(numel)
    kept = tiny(x)
    handed = {}

    def keeping(name, backend):  # a backend that keeps the callable it hands Dynamo
        def compile(gm, example_inputs):
            handed[name] = backend(gm, example_inputs)
            return handed[name]
        return compile

    tpu = torch.compile(tiny, backend=keeping("tpu", tpu_backend), fullgraph=True)
    inductor = torch.compile(tiny, backend=keeping("inductor", compile_fx), fullgraph=True)
    frame = torch.compile(tiny, backend=lambda gm, example_inputs: lambda *args: (kept,), fullgraph=True)
    for fn in (tpu, inductor, frame):
        torch.testing.assert_close(fn(x), tiny(x), rtol=0, atol=0)
    direct, inductor_callable = handed["tpu"], handed["inductor"]
    graph = direct.runner  # the CompiledGraph behind lean.direct
    exe = graph.executable_for(graph.fixed_signature)
    arrays = exe.input_arrays([x], frozenset(), x.device)
    results = exe.execute(arrays)
    positions = exe.layout.tensor_inputs

    def inputs():
        if exe.plain_host:  # the steps of run's host path
            return transfer.host_arrays([x], positions, exe.device)
        return exe.input_arrays([x], frozenset(), x.device)

    def outputs():
        if exe.plain_host:
            return [transfer.from_cpu_buffer(a) for a in results]
        return exe.outputs(results, x.device)

    columns = {
        "tpu": lambda: tpu(x),
        "inductor": lambda: inductor(x),
        "eager": lambda: tiny(x),
        "frame": lambda: frame(x),
        "callable": lambda: direct(x),
        "inductor callable": lambda: inductor_callable(x),
        "run": lambda: exe.run([x]),
        "inputs": inputs,
        "execute_sharded": lambda: exe._execute(arrays),
        "execute": lambda: exe.execute(arrays),
        "outputs": outputs,
    }
    for fn in columns.values():
        _timed(fn, calls // 10)  # warm
    out = {k: {"wall": [], "cpu": []} for k in columns}
    for _ in range(rounds):
        for name, fn in columns.items():
            wall, cpu = _timed(fn, calls)
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def breakdown(m: dict, clock: str) -> tuple[dict, dict]:
    """The steps of the tpu and the inductor call per round, from the columns measured alongside
    (module docstring)."""
    rounds = [dict(zip(m, values)) for values in zip(*(m[k][clock] for k in m))]
    tpu = {
        "frame": [r["frame"] for r in rounds],
        "frame extra": [r["tpu"] - r["callable"] - r["frame"] for r in rounds],
        "call path": [r["callable"] - r["run"] for r in rounds],
        "inputs": [r["inputs"] for r in rounds],
        "execute": [r["execute_sharded"] for r in rounds],
        "results": [r["execute"] - r["execute_sharded"] for r in rounds],
        "outputs": [r["outputs"] for r in rounds],
        "run glue": [r["run"] - r["inputs"] - r["execute"] - r["outputs"] for r in rounds],
    }
    inductor = {
        "frame": tpu["frame"],
        "frame extra": [r["inductor"] - r["inductor callable"] - r["frame"] for r in rounds],
        "callable": [r["inductor callable"] for r in rounds],
    }
    return tpu, inductor


def _stat(values: list[float]) -> str:
    return f"{min(values):6.1f} {statistics.median(values):6.1f}"


def table(rows: dict) -> str:
    """rows: {thread setting: measured columns}."""
    lines = []
    for setting, m in rows.items():
        if "error" in m:
            lines.append(f"threads {setting}: error: {m['error']}")
            continue
        lines.append(f"threads {setting} — µs per call, min and median over {len(m['tpu']['cpu'])} rounds")
        lines.append(f"{'':22} | {'CPU min   med':>13} | {'wall min   med':>14}")
        for name in ("tpu", "inductor", "eager"):
            lines.append(f"{name:22} | {_stat(m[name]['cpu'])} | {_stat(m[name]['wall'])}")
        for ref in ("inductor", "eager"):
            ratio = {c: [a / b for a, b in zip(m["tpu"][c], m[ref][c])] for c in ("cpu", "wall")}
            lines.append(f"{'tpu / ' + ref:22} | {_stat(ratio['cpu'])} | {_stat(ratio['wall'])}")
        (tpu_cpu, inductor_cpu), (tpu_wall, inductor_wall) = breakdown(m, "cpu"), breakdown(m, "wall")
        for title, steps, cpu, wall in (("tpu call, step by step:", TPU_STEPS, tpu_cpu, tpu_wall),
                                        ("inductor call:", INDUCTOR_STEPS, inductor_cpu, inductor_wall)):
            lines.append(title)
            for step in steps:
                lines.append(f"  {step:20} | {_stat(cpu[step])} | {_stat(wall[step])}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", choices=["both", "default", "1"], default="both")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--numel", type=int, default=TINY_NUMEL, help="floats in the graph's input")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.rounds, args.calls, args.numel)))
        return
    from benchmarks.generate_bench import single_thread_env
    from benchmarks.run import cache_env, run_fresh

    settings = ["default", "1"] if args.threads == "both" else [args.threads]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="torchtpu-call-overhead-") as root:
        for setting in settings:
            env = cache_env(root, f"threads-{setting}")
            env = single_thread_env(env) if setting == "1" else env
            rows[setting] = run_fresh(["-m", "benchmarks.call_overhead", "--child", "--rounds", str(args.rounds),
                                       "--calls", str(args.calls), "--numel", str(args.numel)], env)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    print(table(rows))


if __name__ == "__main__":
    main()
