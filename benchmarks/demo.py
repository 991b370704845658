"""`make demo`: compile a small transformer with backend="tpu" and compare with eager.

Prints max |eager - compiled|, the first-call (compile) seconds, and steady-state ms of
both. Run: python -m benchmarks.demo
"""
from __future__ import annotations

import time
import warnings

import torch

import torchtpu
from benchmarks import models
from benchmarks.timing import median_ms


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = models.TinyDecoder(vocab=512, dim=128, heads=4, layers=2, max_len=128).eval()
    idx = torch.randint(0, 512, (8, 128))
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    with torch.no_grad():
        expected = model(idx)
        t0 = time.perf_counter()
        actual = compiled(idx)
        first_s = time.perf_counter() - t0
        eager_ms = median_ms(lambda: model(idx))
        tpu_ms = median_ms(lambda: compiled(idx))
    diff = (actual - expected).abs().max().item()
    s = torchtpu.stats()
    from torchtpu.runtime.platform import default_platform

    print(f"torchtpu demo: 2-layer decoder (dim 128, batch 8 x seq 128) on platform={default_platform()}")
    print(f"  max |eager - compiled|  {diff:.3e}")
    print(f"  first call (compile)    {first_s:.2f} s   (XLA compile {s.get('compile_s', 0):.2f} s, "
          f"{s['xla_compiles']} program)")
    print(f"  steady state            tpu {tpu_ms:.2f} ms   eager {eager_ms:.2f} ms   "
          f"(tpu/eager {tpu_ms / eager_ms:.2f}x)")
    if diff > 1e-3:
        raise SystemExit(f"demo: compiled output differs from eager by {diff}")


if __name__ == "__main__":
    main()
