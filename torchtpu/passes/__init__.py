"""Graph passes over ATen FX graphs, run in order by run_passes (see README.md)."""
from torchtpu.passes.manager import run_passes

__all__ = ["run_passes"]
