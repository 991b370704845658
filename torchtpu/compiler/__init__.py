"""FX -> StableHLO -> XLA executable."""
from torchtpu.compiler import rules  # noqa: F401  (registers every lowering rule)
from torchtpu.compiler.driver import compile_graph

__all__ = ["compile_graph"]
