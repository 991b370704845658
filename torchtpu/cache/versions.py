"""What the compiled program depends on besides the graph: library versions, this package's
source, the compile host and the flags XLA reads."""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

FORMAT_VERSION = 1  # bump when the entry layout or the key's canonical forms change


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def source_hash() -> str:
    """sha256 over every .py and .cc file of torchtpu (path and contents): any code change is a new key."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.cc")]):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def host_cpu() -> str:
    """XLA:CPU code is generated for this CPU's features: a shared cache must not run it elsewhere."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def xla_flags() -> str:
    return f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')} LIBTPU_INIT_ARGS={os.environ.get('LIBTPU_INIT_ARGS', '')}"


@functools.cache
def libraries() -> dict[str, str]:
    import jax
    import jaxlib
    import torch

    return {"torch": torch.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "libtpu": package_version("libtpu")}
