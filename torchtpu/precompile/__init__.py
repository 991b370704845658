"""Warm start without tracing: torch's precompile path for backend="tpu" (docs/precompile.md).

    torchtpu.precompile.save(model, example_args, path, **compile_kwargs)
    torchtpu.precompile.load(path, model=None) -> a callable
"""
from __future__ import annotations


def __getattr__(name: str):
    if name in ("save", "load", "Precompiled"):  # the backend imports this package: keep it light
        from torchtpu.precompile import api

        return getattr(api, name)
    raise AttributeError(f"module 'torchtpu.precompile' has no attribute {name!r}")
