"""Which PJRT platform runs our programs: TPU if attached, else GPU, else CPU.

Chosen once per process; `TORCHTPU_PLATFORM=cpu|gpu|tpu` overrides the choice.
"""
from __future__ import annotations

import functools
import os

import jax

from torchtpu.compiler.errors import UnsupportedPlatformError

PLATFORMS = ("tpu", "gpu", "cpu")


def available(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


@functools.cache
def default_platform() -> str:
    """The platform of this process: TORCHTPU_PLATFORM, else the first of tpu, gpu, cpu present."""
    asked = os.environ.get("TORCHTPU_PLATFORM", "").strip().lower()
    if asked:
        if asked not in PLATFORMS:
            raise UnsupportedPlatformError(f"TORCHTPU_PLATFORM={asked!r}: use one of {', '.join(PLATFORMS)}")
        if not available(asked):
            raise UnsupportedPlatformError(
                f"TORCHTPU_PLATFORM={asked} but JAX finds no {asked} device here "
                f"(available: {', '.join(p for p in PLATFORMS if available(p))}). "
                "Install the matching jax plugin (libtpu for TPU, jax[cuda] for GPU) or unset the variable."
            )
        return asked
    return next(p for p in PLATFORMS if available(p))


def device(platform: str | None = None) -> jax.Device:
    platform = platform or default_platform()
    if not available(platform):
        raise UnsupportedPlatformError(f"no {platform} device in this process")
    return jax.devices(platform)[0]
