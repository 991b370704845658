"""An ATen graph as AOTAutograd handed it to us, in a form that pickles, and rebuilt in another process.

A precompiled artifact carries graphs, not programs: on load each graph goes through the same
driver again (passes, cache key, disk tier), so its executables come from the compile cache,
and a graph the cache lacks compiles as any other would. The driver needs the graph exactly as
it was, node for node, with each node's fake value (`meta["val"]`) and the shape environment
its symbolic sizes live in. torch's GraphPickler keeps all three; FX's own pickling does not
(it re-traces the code, which folds constant subgraphs and drops node metadata, so the cache
key would change).

Node metadata that names the model's classes and functions (which module a node came from) is
left out: nothing below the backend reads it, and a class defined inside a function (a
notebook's model, a library's generated layer) does not pickle. torch's own filter drops the
forward's stacks but not the copies AOTAutograd puts on backward nodes (`fwd_nn_module_stack`).
"""
from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._graph_pickler import GraphPickler, Options
from torch.fx.experimental.symbolic_shapes import ShapeEnv

# source_fn_stack, nn_module_stack and their fwd_ copies on backward nodes
_PROVENANCE = ("nn_module_stack", "source_fn_stack")


def _kept(key: str) -> bool:
    return not key.endswith(_PROVENANCE)


@dataclasses.dataclass
class SavedGraph:
    """The graph and its example inputs, pickled at once (passes mutate the graph later)."""

    data: bytes

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, example_inputs) -> "SavedGraph":
        # every op is allowed: custom ops (a model library's) resolve by name on load
        options = Options(ops_filter=None, node_metadata_key_filter=_kept)
        return cls(GraphPickler.dumps((gm, list(example_inputs)), options))

    def rebuild(self) -> tuple[torch.fx.GraphModule, list]:
        """The graph, with every node's fake value, and fake example inputs for it."""
        mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
        gm, inputs = GraphPickler.loads(self.data, mode)
        return gm, inputs
