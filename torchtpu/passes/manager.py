"""The pass manager: every pass is named, timed, and can dump the graph it leaves."""
from __future__ import annotations

import time
from typing import Callable

import torch

from torchtpu import counters

Pass = Callable[[torch.fx.GraphModule, object], torch.fx.GraphModule]

# The passes, in order. Each states what it assumes and preserves in passes/README.md.
PASSES: list[tuple[str, Pass]] = []


def run_passes(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    for name, fn in PASSES:
        t0 = time.perf_counter()
        gm = fn(gm, options)
        gm.graph.lint()
        counters.add_seconds(f"pass.{name}", time.perf_counter() - t0)
    return gm
