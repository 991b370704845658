"""torchtpu: a torch.compile backend that lowers to StableHLO and runs with XLA through PJRT.

    model = torch.compile(model, backend="tpu", fullgraph=True)
"""
from torchtpu import precompile  # noqa: F401  (light: its API loads on first use)
from torchtpu.counters import reset_stats, stats
from torchtpu.eager import eager_mode, sync

__version__ = "0.1.0"


def export(fn_or_module, *example_args, platforms=("cpu", "tpu"), **example_kwargs):
    """Exports the forward program(s) of `fn_or_module` as StableHLO for `platforms`.

    Works without any of those devices attached. See torchtpu.compiler.export.
    """
    from torchtpu.compiler.export import export as _export

    return _export(fn_or_module, *example_args, platforms=platforms, **example_kwargs)


__all__ = ["export", "precompile", "stats", "reset_stats", "eager_mode", "sync", "__version__"]
