"""The StableHLO kept next to each executable, as a versioned portable artifact."""
from __future__ import annotations


def to_portable(lowered) -> tuple[bytes, str]:
    """(blob, format): StableHLO portable bytecode (as `jax.export` writes it), else MLIR text."""
    from jax._src.export import _export  # the one place jax serializes modules with the sdy dialect

    try:
        return _export._module_to_bytecode(lowered.compiler_ir("stablehlo")), "stablehlo-portable"
    except Exception:  # noqa: BLE001 — text is always possible and still parses
        return lowered.as_text().encode(), "mlir-text"


def parse(blob: bytes, fmt: str) -> int:
    """Parses a stored program; returns its number of StableHLO ops. Raises on a bad artifact."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        if fmt == "stablehlo-portable":
            module = _jax.mlir.deserialize_portable_artifact(blob)
        else:
            module = ir.Module.parse(blob.decode())
        return str(module).count("stablehlo.")
