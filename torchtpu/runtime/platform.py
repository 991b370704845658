"""Which PJRT platform runs our programs: TPU if attached, else GPU, else CPU.

Chosen once per process; `TORCHTPU_PLATFORM=cpu|gpu|tpu` overrides the choice.
"""
from __future__ import annotations

import functools
import glob
import os

import jax

from torchtpu.compiler.errors import UnsupportedPlatformError

PLATFORMS = ("tpu", "gpu", "cpu")
_ACCELERATOR_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*")


def _skip_absent_accelerators() -> None:
    """On a machine with no TPU or GPU device files, JAX initializes only its CPU backend.

    Otherwise an installed libtpu (wanted here for deviceless TPU compiles, which do not need
    the TPU backend) is loaded and probed at the first device query: +190 MB of resident
    memory (measured) and pages of TPU-init warnings. Left alone when the user chose JAX's
    platforms, asked for a platform, or JAX already started its backends.
    """
    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
        return
    if os.environ.get("TORCHTPU_PLATFORM", "").strip().lower() in ("tpu", "gpu"):
        return
    if any(glob.glob(pattern) for pattern in _ACCELERATOR_FILES):
        return
    from jax._src import xla_bridge

    if xla_bridge._backends:  # already initialized: changing the platforms now would not apply
        return
    jax.config.update("jax_platforms", "cpu")


_skip_absent_accelerators()


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
