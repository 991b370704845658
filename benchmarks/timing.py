"""Timing helpers for the benchmarks (never used by tests)."""
from __future__ import annotations

import statistics
import time


def samples_ms(fn, warmup: int = 3, runs: int = 30) -> list[float]:
    """Milliseconds of each of `runs` calls of fn, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def median_ms(fn, warmup: int = 3, runs: int = 30) -> float:
    return statistics.median(samples_ms(fn, warmup, runs))
