"""The pass manager: every pass is named, timed, checked, and can dump the graph it leaves."""
from __future__ import annotations

import time
from typing import Callable

import torch

from torchtpu import counters
from torchtpu.passes.bucketing import bucket_shapes
from torchtpu.passes.conv_bn import fuse_conv_bn
from torchtpu.passes.index_checks import mark_index_checks
from torchtpu.passes.pallas_rewrites import fuse_rms_norm

Pass = Callable[[torch.fx.GraphModule, object], torch.fx.GraphModule]

# The passes, in order. Each states what it assumes and preserves in passes/README.md.
# Bucketing runs last: its pad-safety analysis must see the final graph.
PASSES: list[tuple[str, Pass]] = [
    ("pallas_rewrites", fuse_rms_norm),
    ("conv_bn", fuse_conv_bn),
    ("index_checks", mark_index_checks),
    ("bucketing", bucket_shapes),
]


class PassInvariantError(RuntimeError):
    """A graph pass left (or met) an invalid graph: the message names the pass."""


def run_passes(gm: torch.fx.GraphModule, options, passes=None) -> torch.fx.GraphModule:
    """Runs `passes` (default PASSES) in order; after each, the graph must lint: topological
    order, every argument defined before use, one output. A violation names the pass."""
    for name, fn in PASSES if passes is None else passes:
        t0 = time.perf_counter()
        try:
            gm = fn(gm, options)
        except Exception as e:
            e.add_note(f"(raised in torchtpu graph pass {name!r})")
            raise
        try:
            gm.graph.lint()
        except RuntimeError as e:
            raise PassInvariantError(f"torchtpu: graph pass {name!r} left an invalid graph: {e}") from e
        counters.add_seconds(f"pass.{name}", time.perf_counter() - t0)
    return gm
