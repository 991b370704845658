"""An ATen graph as AOTAutograd handed it to us, in a form that pickles, and rebuilt in another process.

A precompiled artifact carries graphs, not programs: on load each graph goes through the same
driver again (passes, cache key, disk tier), so its executables come from the compile cache,
and a graph the cache lacks compiles as any other would. The driver needs the graph exactly as
it was, node for node, with each node's fake value (`meta["val"]`) and the shape environment
its symbolic sizes live in. torch's GraphPickler keeps all three; FX's own pickling does not
(it re-traces the code, which folds constant subgraphs and drops node metadata, so the cache
key would change).
"""
from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._graph_pickler import GraphPickler, Options
from torch.fx.experimental.symbolic_shapes import ShapeEnv


@dataclasses.dataclass
class SavedGraph:
    """The graph and its example inputs, pickled at once (passes mutate the graph later)."""

    data: bytes

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, example_inputs) -> "SavedGraph":
        # every op is allowed: custom ops (a model library's) resolve by name on load
        return cls(GraphPickler.dumps((gm, list(example_inputs)), Options(ops_filter=None)))

    def rebuild(self) -> tuple[torch.fx.GraphModule, list]:
        """The graph, with every node's fake value, and fake example inputs for it."""
        mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
        gm, inputs = GraphPickler.loads(self.data, mode)
        return gm, inputs
