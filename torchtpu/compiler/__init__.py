"""FX -> StableHLO -> XLA executable.

Light to import: the driver loads on first use of `compile_graph`, the lowering rules on the
registry's first lookup, so the cache and the runtime can use this package's small modules
(spec, checks) without loading the compiler.
"""


def __getattr__(name: str):
    if name == "compile_graph":
        from torchtpu.compiler.driver import compile_graph

        return compile_graph
    raise AttributeError(f"module 'torchtpu.compiler' has no attribute {name!r}")


__all__ = ["compile_graph"]
