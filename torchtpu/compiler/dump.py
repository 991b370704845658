"""TORCHTPU_DUMP_DIR: per compiled graph, the ATen FX graph, the StableHLO and a summary line."""
from __future__ import annotations

import os
from pathlib import Path

from torchtpu.compiler.spec import describe


def dump_dir(options) -> Path | None:
    folder = getattr(options, "dump_dir", None) or os.environ.get("TORCHTPU_DUMP_DIR")
    return Path(folder) if folder else None


def write(options, name: str, gm, spec: tuple, lowered, lower_s: float, compile_s: float) -> None:
    folder = dump_dir(options)
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.fx.txt").write_text(gm.print_readable(print_output=False))
    (folder / f"{name}.stablehlo.mlir").write_text(lowered.as_text())
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function")
    line = (f"{name}: ops={ops} inputs={describe(spec)} "
            f"lower_ms={lower_s * 1e3:.1f} compile_ms={compile_s * 1e3:.1f}\n")
    with open(folder / "summary.txt", "a") as f:
        f.write(line)
