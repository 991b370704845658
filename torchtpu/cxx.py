"""Building one of torchtpu's C++ libraries against this process's torch (and its loading rules).

    library_path(source, stem, *versions)   where it lives: TORCHTPU_EXTENSION_DIR, default
                                            `$XDG_CACHE_HOME/torchtpu/extensions`, one file per
                                            source, torch, C++ ABI and the given versions
    build(source, path, includes, what[, python])
                                            compiles it unless it exists, under a lock, atomically
                                            (python: also a CPython extension module)
    switched_on(var)                        the library's environment switch (unset: on)
    why_not(exc)                            what a failed build or load says, the compiler's tail too

Used by kernels/aten_cpu.py (ATen's kernels as XLA custom calls) and device/native.py (the
eager device's C++ registrations, built at the first tpu tensor: so this module imports nothing
of JAX, and sits in the core layer). A directory another user owns, or others may write to, is
refused: a library there is machine code this process would run.
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
from pathlib import Path

from torchtpu.fsutil import locked
from torchtpu.paths import untrusted, user_cache_dir

log = logging.getLogger("torchtpu.kernels")


def switched_on(var: str) -> bool:
    return os.environ.get(var, "1").strip().lower() not in ("0", "off", "false", "no")


def why_not(exc: BaseException) -> str:
    detail = getattr(exc, "stderr", "") or ""
    return f"{exc}\n{detail[-2000:]}".strip()


def library_path(source: Path, stem: str, *versions: str) -> Path:
    import torch

    asked = os.environ.get("TORCHTPU_EXTENSION_DIR", "").strip()
    root = Path(asked) if asked else user_cache_dir() / "extensions"
    h = hashlib.sha256(source.read_bytes())
    for part in (torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI), *versions):
        h.update(b"\0" + part.encode())
    return root.expanduser() / f"{stem}-{h.hexdigest()[:16]}.so"


def build(source: Path, path: Path, includes: list, what: str, python: bool = False) -> Path:
    """Compiles `source` into `path` unless it exists; `python`: it is also a CPython extension
    module, against this Python's headers and torch's Python bindings (libtorch_python). Raises
    OSError, or CalledProcessError with the compiler's output, when it cannot."""
    import sysconfig

    import torch

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    why = untrusted(path.parent)
    if why is not None:
        raise OSError(f"{why}; a library there is not loaded (it is machine code this process would run)")
    with locked(path.parent / ".lock"):
        if path.exists():
            return path
        torch_dir = Path(torch.__file__).parent
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        if python:
            includes = [*includes, torch_dir / "include/torch/csrc/api/include", sysconfig.get_paths()["include"]]
        cmd = [os.environ.get("CXX", "g++"), "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               f"-I{torch_dir / 'include'}", *[f"-I{d}" for d in includes], str(source),
               f"-L{torch_dir / 'lib'}", *(["-ltorch_python"] if python else []), "-ltorch_cpu", "-lc10",
               f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(tmp)]
        log.warning("torchtpu: building %s into %s (once per torch version, ~10 s)", what, path)
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path
