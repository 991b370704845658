"""The `mesh` option: named device axes ("dp" for data, "tp" for tensor parallelism) -> a jax Mesh."""
from __future__ import annotations

import math

import jax
import numpy as np

AXES = ("dp", "tp")  # data parallel (batch dim of inputs), tensor parallel (the tp_plan's axis)


def parse_mesh(value) -> tuple[tuple[str, int], ...] | None:
    """Validates the `mesh` option and normalises it to ((axis, size), ...) in AXES order.

    Args:
        value: None, or a dict {"dp": N, "tp": M} (either axis may be left out; one size may
            be -1: the devices left over by the other axis).

    Returns:
        None, or a tuple of (axis, size) pairs (hashable, for Options and the cache key).
    """
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"torchtpu: option mesh={value!r}; use a dict such as {{'dp': 2, 'tp': 4}}")
    unknown = sorted(set(value) - set(AXES))
    if unknown:
        raise ValueError(f"torchtpu: option mesh has unknown axis {unknown}; axes are {list(AXES)} "
                         "(dp shards the batch dimension of inputs, tp shards parameters by tp_plan)")
    for axis, size in value.items():
        if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ValueError(f"torchtpu: option mesh[{axis!r}]={size!r}; use a positive int (or -1 for the rest)")
    if sum(size == -1 for size in value.values()) > 1:
        raise ValueError(f"torchtpu: option mesh={value!r}: at most one axis may be -1")
    return tuple((axis, value[axis]) for axis in AXES if axis in value)


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
