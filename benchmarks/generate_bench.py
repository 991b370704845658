"""Greedy Hugging Face generate() with a static KV cache: eager vs backend="tpu", side by side.

    python -m benchmarks.generate_bench [--cache-lens 256,4096] [--new-tokens 32] [--threads N]

The model's forward is compiled (`model.forward = torch.compile(model.forward, backend=...,
fullgraph=True)`), so the prefill and every decode step run compiled. Each (backend, cache
length) runs in a fresh process with empty compile caches. Prints per cell: first generate
(s, compile included), tokens/s of a warm generate, the decode-step median (ms, one forward
call with one new token), for tpu the part of it spent in the executable (marshal + run),
XLA compiles (and whether they grew after the first decode step), the KV-cache bytes written
back per step, and whether the tokens equal eager's. `--threads 1` pins torch and XLA to one
thread each, for machines whose cores are shared (parallel copies then wait on busy cores).

`measure(backend, quick=False)` is the measurement the benchmark suite's decode cell calls.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

MODEL = dict(layers=4, vocab=1024, hidden=256, heads=8, kv_heads=4)
PROMPT = 16


def build_model():
    """The Llama-style decoder (random weights, seed 0), set up for a static-cache generate()."""
    import torch

    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama(**MODEL)
    model.config.use_cache = True  # hf_llama turns the cache off for forward-only benchmarks
    model.generation_config.use_cache = True
    return model


class StepClock:
    """Wraps a forward: records the wall time of each decode call (one new token) and the
    XLA compile count after it."""

    def __init__(self, forward):
        self.forward, self.steps_ms, self.compiles = forward, [], []

    def __call__(self, *args, **kwargs):
        import torchtpu

        t0 = time.perf_counter()
        out = self.forward(*args, **kwargs)
        if kwargs["input_ids"].shape[1] == 1:
            self.steps_ms.append((time.perf_counter() - t0) * 1e3)
            self.compiles.append(torchtpu.stats()["xla_compiles"])
        return out


def executable_clock() -> list:
    """Times every torchtpu executable call (marshal in, run, marshal out); returns the list it fills."""
    import torchtpu.compiler  # noqa: F401  (the runtime imports the compiler package first)
    from torchtpu.runtime import executable

    samples, run = [], executable.Executable.run

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = run(self, *args, **kwargs)
        samples.append((time.perf_counter() - t0) * 1e3)
        return out

    executable.Executable.run = timed
    return samples


def measure(backend: str, quick: bool = False, cache_len: int = 256, new_tokens: int = 32) -> dict:
    """First generate, then warm ones, of one backend in this process.

    Args:
        backend: "eager" or a torch.compile backend ("tpu", "inductor").
        quick: one warm generate instead of three.
        cache_len: the static cache's max_cache_len (every decode step attends over all of it).
        new_tokens: tokens generated per call (greedy).
    Returns:
        first_call_s, tokens_per_s, decode_step_ms (median), exe_ms (tpu: median executable call),
        xla_compiles, compiles_after_first_step, cache_mb, tokens.
    """
    import torch
    from transformers import StaticCache

    import torchtpu

    model = build_model()
    prompt = torch.randint(0, MODEL["vocab"], (1, PROMPT), generator=torch.Generator().manual_seed(1))
    forward = model.forward if backend == "eager" else torch.compile(model.forward, backend=backend, fullgraph=True)
    exe_ms = executable_clock() if backend == "tpu" else []
    clock = model.forward = StepClock(forward)

    def generate():
        cache = StaticCache(config=model.config, max_cache_len=cache_len)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, cache=cache)
        return out, time.perf_counter() - t0, cache

    tokens, first_s, cache = generate()
    compiles_first_step = clock.compiles[0]
    clock.steps_ms.clear()
    exe_ms.clear()
    warm = [generate()[1] for _ in range(1 if quick else 3)]
    cache_bytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return {"backend": backend, "cache_len": cache_len, "first_call_s": first_s,
            "tokens_per_s": new_tokens / statistics.median(warm),
            "decode_step_ms": statistics.median(clock.steps_ms),
            "exe_ms": statistics.median(exe_ms) if exe_ms else None,
            "xla_compiles": torchtpu.stats()["xla_compiles"],
            "compiles_after_first_step": torchtpu.stats()["xla_compiles"] - compiles_first_step,
            "cache_mb": cache_bytes / 2**20, "tokens": tokens[0, PROMPT:].tolist()}


def probe_donation(cache_mb: float = 2.0, runs: int = 50) -> dict:
    """What buffer donation buys on this process's platform for one cache update (one token
    written into a [rows, 4096] float32 cache of `cache_mb`), and when PJRT honours it.

    Returns:
        update_ms / donated_update_ms: the program's time without and with the cache donated
        (a buffer PJRT owns); and, per kind of input buffer, whether the donated input's memory
        became the output's (aliased) or the program wrote a fresh copy.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import torchtpu.compiler  # noqa: F401  (the runtime imports the compiler package first)
    from torchtpu.runtime import platform, transfer

    device = platform.device()  # torchtpu's device for this process (TORCHTPU_PLATFORM)
    rows = max(1, int(cache_mb * 2**20 / 4 / 4096))

    def update(cache, row, pos):
        return (jax.lax.dynamic_update_slice(cache, row, (0, pos)),)

    def compiled(donate):
        avals = [jax.ShapeDtypeStruct((rows, 4096), jnp.float32), jax.ShapeDtypeStruct((rows, 1), jnp.float32),
                 jax.ShapeDtypeStruct((), jnp.int32)]
        jitted = jax.jit(update, keep_unused=True, donate_argnums=(0,) if donate else ())
        return jitted.trace(*avals).lower().compile()._executable.xla_executable

    plain, donating = compiled(False), compiled(True)
    row, pos = jax.device_put(np.ones((rows, 1), np.float32), device), jax.device_put(np.int32(5), device)

    def run(exe, cache):
        return exe.execute_sharded([cache, row, pos]).disassemble_into_single_device_arrays()[0][0]

    host_zeros = jax.device_put(np.zeros((rows, 4096), np.float32), device)

    def owned():  # a program's result: memory PJRT allocated (device_put may view numpy's memory)
        return jax.block_until_ready(run(plain, host_zeros))

    def ms(exe, donate):
        cache, samples = owned(), []
        for _ in range(runs):
            t0 = time.perf_counter()
            out = jax.block_until_ready(run(exe, cache))
            samples.append((time.perf_counter() - t0) * 1e3)
            cache = out if donate else cache
        return statistics.median(samples)

    def aliased(make_input, tries=5) -> str:
        """How often the donated input's memory became the output's, e.g. "5/5"."""
        hits = 0
        for _ in range(tries):
            cache, keep_alive = make_input()
            pointer = cache.unsafe_buffer_pointer()
            hits += run(donating, cache).unsafe_buffer_pointer() == pointer
            del keep_alive
        return f"{hits}/{tries}"

    def viewed_by_torch():  # a PJRT buffer torch holds a zero-copy view of (a result we returned)
        cache = owned()
        return cache, transfer.to_torch(cache)

    def torch_memory():  # torch's memory seen by PJRT (how inputs travel on the CPU)
        t = torch.zeros(rows, 4096)
        return transfer.to_device(t, device), t

    return {"platform": device.platform, "cache_mb": rows * 4096 * 4 / 2**20,
            "update_ms": ms(plain, False), "donated_update_ms": ms(donating, True),
            "aliased_owned_buffer": aliased(lambda: (owned(), None)),
            "aliased_buffer_viewed_by_torch": aliased(viewed_by_torch),
            "aliased_torch_memory": aliased(torch_memory)}


def single_thread_env(env: dict) -> dict:
    """One torch thread and one XLA thread (XLA_FLAGS is part of the compile-cache key).

    XLA:CPU's thread pool has as many threads as cores whatever XLA_FLAGS says (its Eigen flag
    only keeps single ops from splitting across it); PJRT_NPROC sizes that pool."""
    flags = "--xla_cpu_multi_thread_eigen=false"
    return {**env, "TORCHTPU_BENCH_THREADS": "1", "PJRT_NPROC": "1",
            "XLA_FLAGS": f"{env.get('XLA_FLAGS', '')} {flags}".strip()}


def run_cells(backends, cache_lens, new_tokens: int, threads: int | None) -> list[dict]:
    from benchmarks.run import cache_env, run_fresh

    rows = []
    with tempfile.TemporaryDirectory(prefix="torchtpu-generate-") as root:
        for cache_len in cache_lens:
            for backend in backends:
                env = cache_env(root, f"{backend}-{cache_len}")
                env = single_thread_env(env) if threads == 1 else env
                row = run_fresh(["-m", "benchmarks.generate_bench", "--child", backend, str(cache_len),
                                 str(new_tokens)], env)
                print(f"  {backend:8} cache {cache_len:5}: {row if 'error' in row else 'ok'}", file=sys.stderr)
                rows.append({"backend": backend, "cache_len": cache_len, **row})
    return rows


def table(rows: list[dict]) -> str:
    eager = {r["cache_len"]: r for r in rows if r["backend"] == "eager" and "error" not in r}
    head = (f"{'backend':8} | {'cache':>5} | {'first s':>7} | {'tok/s':>7} | {'step ms':>7} | {'x eager':>7} | "
            f"{'exe ms':>6} | {'compiles':>8} | {'+after step 1':>13} | {'cache MB':>8} | same tokens")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['backend']:8} | {r['cache_len']:>5} | error: {r['error']}")
            continue
        ref = eager.get(r["cache_len"])
        ratio = f"{r['decode_step_ms'] / ref['decode_step_ms']:.2f}" if ref else "-"
        same = "-" if ref is None or r is ref else ("yes" if r["tokens"] == ref["tokens"] else "NO")
        exe = f"{r['exe_ms']:.2f}" if r["exe_ms"] is not None else "-"
        lines.append(f"{r['backend']:8} | {r['cache_len']:>5} | {r['first_call_s']:>7.2f} | {r['tokens_per_s']:>7.1f} | "
                     f"{r['decode_step_ms']:>7.2f} | {ratio:>7} | {exe:>6} | {r['xla_compiles']:>8} | "
                     f"{r['compiles_after_first_step']:>13} | {r['cache_mb']:>8.2f} | {same}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="eager,tpu")
    parser.add_argument("--cache-lens", default="256,4096")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="1: one torch and one XLA thread")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--probe-donation", action="store_true",
                        help="only measure what donating the cache buffer does on this platform")
    parser.add_argument("--child", nargs=3, metavar=("BACKEND", "CACHE_LEN", "NEW_TOKENS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import warnings

        import torch

        warnings.filterwarnings("ignore")
        if os.environ.get("TORCHTPU_BENCH_THREADS"):
            torch.set_num_threads(int(os.environ["TORCHTPU_BENCH_THREADS"]))
        backend, cache_len, new_tokens = args.child
        print(json.dumps(measure(backend, cache_len=int(cache_len), new_tokens=int(new_tokens))))
        return
    if args.probe_donation:
        print(json.dumps(probe_donation(), indent=1))
        return
    rows = run_cells(args.backends.split(","), [int(n) for n in args.cache_lens.split(",")], args.new_tokens,
                     args.threads)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
