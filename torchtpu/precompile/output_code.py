"""Our compiled graphs in the form torch's precompile path serializes (an `OutputCode`).

Under `aot_compile` (and Dynamo's caching precompile) AOTAutograd bundles each compiled graph
into the artifact, which needs its compilers to return `OutputCode`s. Ours carries the graph
as AOTAutograd handed it over (SavedGraph) and how the backend compiled it; the runner itself
(JAX and XLA objects) is dropped before pickling and rebuilt on load:
- a graph with static inputs also carries the graph parts of its cache key, so on load its
  executable comes straight from the cache's tiers, with no pass run and no graph unpickled;
- otherwise (a symbolic graph, a DeferAndFuse one, or a cache miss) the graph is rebuilt and
  goes through compile_graph, whose executables come from the cache as well.
See docs/DECISIONS.md 54.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from torch._inductor.output_code import OutputCode

from torchtpu.precompile.saved_graph import SavedGraph


@dataclasses.dataclass(frozen=True)
class CachedSignature:
    """A static graph's one signature and the parts of its cache key the graph fixes."""

    spec: tuple
    key_parts: tuple
    waits: bool = True  # its caller waits for the results (runtime/executable.py `load`; an older artifact: True)

    @classmethod
    def of(cls, runner) -> "CachedSignature | None":
        from torchtpu.cache import key as keys
        from torchtpu.cache.canonical import Unkeyable
        from torchtpu.runtime.executable import CompiledGraph

        if not isinstance(runner, CompiledGraph) or runner.fixed_signature is None or runner.gm is None:
            return None
        try:
            return cls(runner.fixed_signature, keys.graph_parts(runner.gm, runner.fixed_signature), runner.waits)
        except Unkeyable:
            return None


@dataclasses.dataclass
class TpuOutputCode(OutputCode):
    """One graph AOTAutograd compiled: forward, backward or inference.

    Args:
        graph: the graph and its inputs, picklable.
        options: the backend options it was compiled with (an Options).
        kind: "forward", "backward" or "inference".
        resident: positions of parameters and buffers among its inputs.
        dense_outputs_from: see CompiledGraph.dense_outputs_from.
        cached: for a static graph, where its executable is in the cache.
        runner: the live runner (None in the artifact until post_compile rebuilds it).
        passthrough: the outputs taken out of `graph` because they are its inputs
            (runtime/passthrough.py `split`); the runner's results get them back.
        boundary: the layouts at its boundary with its forward or backward (a
            layout.BoundaryLayouts; None in an older artifact: every layout row-major).
    """

    graph: SavedGraph
    options: Any
    kind: str
    resident: frozenset
    dense_outputs_from: int | None
    cached: CachedSignature | None = None
    runner: Callable | None = None
    passthrough: tuple = ()
    boundary: Any = None

    def __post_init__(self):
        self._boxed_call = True  # AOTAutograd calls it with the argument list (boxed)
        self._compiled: Callable | None = None

    def __call__(self, inputs):
        if self.runner is None:
            self.rebuild()
        return self.runner(inputs)

    def prepare_for_serialization(self) -> None:
        self.runner = None  # a shallow copy of the live object: the live one keeps its runner
        self._compiled = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        # a backward graph loads at its first call: the first result (the forward's) waits for
        # one executable, and a process that only runs inference never loads the other
        if self.runner is None and self.kind != "backward":
            self.rebuild()

    def set_triton_bundle(self, triton_bundle) -> None:
        pass

    def rebuild(self) -> None:
        from torchtpu.runtime import passthrough

        self.runner = passthrough.wrap(self._from_cache() or self._compile(), self.passthrough)

    def _from_cache(self) -> Callable | None:
        """The static graph's runner with its executable from the cache, or None on a miss."""
        if self.cached is None:
            return None
        from torchtpu import cache
        from torchtpu.cache import key as keys
        from torchtpu.cache.canonical import Unkeyable
        from torchtpu.runtime import target as targets
        from torchtpu.runtime.executable import CompiledGraph

        target, device = targets.resolve(self.options)
        try:
            key = keys.with_environment(self.cached.key_parts, self.options, target)
        except Unkeyable:
            return None
        exe = cache.lookup(key, target, device, self.kind, self.cached.waits)
        if exe is None:
            return None
        runner = CompiledGraph(lambda spec: self._compile().executable_for(spec), self.kind, self.resident,
                               load_graph=lambda: self._compile().gm)
        runner.waits = self.cached.waits
        runner.preload(self.cached.spec, exe)
        runner.dense_outputs_from = self.dense_outputs_from
        return runner

    def _compile(self) -> Callable:
        """The graph rebuilt and compiled through the driver: passes, key, then the cache's tiers."""
        if self._compiled is None:
            from torchtpu.compiler.driver import compile_graph

            gm, fakes = self.graph.rebuild()
            runner = compile_graph(gm, fakes, self.options, name=self.kind, resident=self.resident,
                                   boundary=self.boundary)
            if self.dense_outputs_from is not None:
                runner.dense_outputs_from = self.dense_outputs_from
            self._compiled = runner
        return self._compiled
