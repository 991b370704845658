"""Precise lowering errors, and the reproducer each one leaves behind."""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

import torch


class LoweringError(RuntimeError):
    """An ATen node could not be lowered. The message names the overload, the FX node,
    the user's source line and the reproducer file."""


class UnsupportedPlatformError(RuntimeError):
    pass


def user_source_line(node: torch.fx.Node) -> str:
    """The innermost user frame of the node's stack trace ("File ..., line N, in f\\n  code")."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lstrip().startswith("File "):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{lines[i].strip()}\n    {code}".rstrip()
    return "<no source line: the node has no stack trace>"


def write_reproducer(gm: torch.fx.GraphModule, example_inputs, reason: str, dump_dir: str | None = None) -> Path:
    """Writes a runnable script that rebuilds the graph and inputs and compiles it again."""
    source = re.sub(r"^class .*?\(torch\.nn\.Module\):", "class Repro(torch.nn.Module):",
                    gm.print_readable(print_output=False), count=1, flags=re.M)
    specs = [_spec(x) for x in example_inputs]
    digest = hashlib.sha256((source + repr(specs)).encode()).hexdigest()[:12]
    folder = Path(dump_dir or os.environ.get("TORCHTPU_DUMP_DIR") or Path(tempfile.gettempdir()) / "torchtpu-repro")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"repro_{digest}.py"
    reason_lines = "\n".join("# " + line for line in reason.splitlines())
    script = f'''# torchtpu reproducer. Run: python {path}
{reason_lines}
import torch
from torch import device  # noqa: F401  (FX prints devices by name)
import torchtpu.compiler


{source}

INPUTS = {specs!r}


def make_inputs():
    out = []
    for spec in INPUTS:
        if spec[0] == "tensor":
            _, shape, dtype = spec
            dtype = getattr(torch, dtype)
            out.append(torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype))
        else:
            out.append(spec[1])
    return out


if __name__ == "__main__":
    gm = torch.fx.symbolic_trace(Repro())
    inputs = make_inputs()
    print(torchtpu.compiler.compile_graph(gm, inputs)(list(inputs)))
'''
    tmp = path.with_suffix(".tmp")
    tmp.write_text(script)
    os.replace(tmp, path)
    return path


def _spec(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", [int(s) for s in x.shape], str(x.dtype).replace("torch.", ""))
    return ("scalar", int(x) if isinstance(x, torch.SymInt) else x)
