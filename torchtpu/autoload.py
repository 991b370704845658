"""The `torch.backends` entry point: torch calls `load()` during every `import torch` of an
environment where torchtpu is installed, so `device="tpu"` works with no other import.

torch turns an exception raised here into a RuntimeError out of `import torch` itself, for every
torch user of the environment. So a failure to register is one warning naming the reason, and
torch stays as it was; `import torchtpu.device` raises the full error. What runs here is paid by
every `import torch`: the device without its kernels, no JAX (torchtpu/device/registration.py).
TORCH_DEVICE_BACKEND_AUTOLOAD=0, torch's own switch, skips it.
"""
from __future__ import annotations

import sys
import warnings


def load() -> None:
    try:
        import torchtpu.device  # noqa: F401  (registers the device)
    except Exception as err:  # noqa: BLE001  (any failure here would break `import torch`)
        _warn(f"torchtpu: device 'tpu' not registered at `import torch` ({type(err).__name__}: {err}). "
              f"torch works without it; `import torchtpu.device` raises the full error. "
              f"TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns torch's backend autoloading off.")


def _warn(message: str) -> None:
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    except Warning:  # warnings turned into errors (-W error): still not a reason to break torch
        print(f"warning: {message}", file=sys.stderr)
