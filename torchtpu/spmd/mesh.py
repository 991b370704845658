"""The `mesh` option: named device axes ("dp" for data, "tp" for tensor parallelism) -> a jax Mesh."""
from __future__ import annotations

import math

import jax
import numpy as np

from torchtpu.options import AXES, parse_mesh  # noqa: F401  (the option's axes, and its parser)


def axis_sizes(axes: tuple[tuple[str, int], ...], device_count: int) -> dict[str, int]:
    """The concrete size of each axis on `device_count` devices (-1 resolved).

    Raises:
        ValueError: the mesh needs more devices than there are, or -1 does not divide evenly.
    """
    sizes = dict(axes)
    fixed = math.prod(s for s in sizes.values() if s != -1)
    for axis, size in sizes.items():
        if size == -1:
            if device_count % fixed:
                raise ValueError(f"torchtpu: mesh {dict(axes)}: {device_count} devices do not split "
                                 f"into {fixed} x N")
            sizes[axis] = device_count // fixed
    need = math.prod(sizes.values())
    if need > device_count:
        raise ValueError(f"torchtpu: mesh {dict(axes)} needs {need} devices, this process sees {device_count} "
                         "(simulate CPU devices with XLA_FLAGS=--xla_force_host_platform_device_count=N, "
                         "set before jax starts)")
    return sizes


def build_mesh(axes: tuple[tuple[str, int], ...], devices) -> jax.sharding.Mesh:
    """A Mesh over the first prod(sizes) of `devices`, axes in AXES order.

    Args:
        axes: the parsed mesh option.
        devices: the devices of the target (all processes' devices under jax.distributed).

    Returns:
        jax.sharding.Mesh with the named axes.
    """
    devices = list(devices)
    sizes = axis_sizes(axes, len(devices))
    shape = tuple(sizes.values())
    grid = np.array(devices[: math.prod(shape)], dtype=object).reshape(shape)
    return jax.sharding.Mesh(grid, tuple(sizes))
