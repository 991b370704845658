"""The pass manager: every pass is named, timed, and can dump the graph it leaves."""
from __future__ import annotations

import time
from typing import Callable

import torch

from torchtpu import counters
from torchtpu.passes.bucketing import bucket_shapes
from torchtpu.passes.conv_bn import fuse_conv_bn
from torchtpu.passes.pallas_rewrites import fuse_rms_norm

Pass = Callable[[torch.fx.GraphModule, object], torch.fx.GraphModule]

# The passes, in order. Each states what it assumes and preserves in passes/README.md.
# Bucketing runs last: its pad-safety analysis must see the final graph.
PASSES: list[tuple[str, Pass]] = [
    ("pallas_rewrites", fuse_rms_norm),
    ("conv_bn", fuse_conv_bn),
    ("bucketing", bucket_shapes),
]


def run_passes(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    for name, fn in PASSES:
        t0 = time.perf_counter()
        gm = fn(gm, options)
        gm.graph.lint()
        counters.add_seconds(f"pass.{name}", time.perf_counter() - t0)
    return gm
