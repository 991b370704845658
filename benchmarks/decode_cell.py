"""The decode-step cell: uses the measurement of benchmarks/generate_bench.py, never a second copy.

generate_bench.py (greedy HF generate with a static KV cache) owns how a decode step is
measured (`measure(backend, quick)`); the suite only runs it in a fresh process per backend
and files the numbers. Without that module the cell says so ("na") instead of guessing.
"""
from __future__ import annotations

import importlib

MODULE = "benchmarks.generate_bench"
KEPT = ("tokens_per_s", "cache_len", "xla_compiles", "compiles_after_first_step")


def decode_step(backend: str, quick: bool = False) -> dict:
    """One backend's decode-step latency, from generate_bench's own measurement.

    Args:
        backend: "eager", "inductor" or "tpu".
        quick: one warm generate instead of three.
    Returns:
        {"median_ms": decode-step median, "first_call_s": first generate (compiling included),
        plus KEPT}, or {"na": reason}.
    """
    try:
        module = importlib.import_module(MODULE)
    except ModuleNotFoundError as e:
        if e.name != MODULE:
            raise
        return {"na": f"{MODULE} does not exist yet"}
    result = module.measure(backend, quick=quick)
    return {"median_ms": result["decode_step_ms"], "first_call_s": result["first_call_s"],
            **{k: result[k] for k in KEPT if k in result}}
