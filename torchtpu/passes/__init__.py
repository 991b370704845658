"""Graph passes over ATen FX graphs, run in order by run_passes (see README.md).

The pass manager loads on first use: the cache and the runtime read a pass's metadata names
(e.g. index_checks.CHECK) without importing every pass.
"""


def __getattr__(name: str):
    if name == "run_passes":
        from torchtpu.passes.manager import run_passes

        return run_passes
    raise AttributeError(f"module 'torchtpu.passes' has no attribute {name!r}")


__all__ = ["run_passes"]
