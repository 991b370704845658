"""What a graph is compiled for: the process's device, or a TPU topology with no TPU attached.

`deviceless_tpu("v5e:2x2")` makes compile_graph produce TPU executables on any machine with
libtpu installed (JAX's deviceless AOT compilation); they can be stored, not run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import jax

from torchtpu.runtime import platform as platforms

_topology: str | None = None


@dataclasses.dataclass(frozen=True)
class Target:
    """The platform and the device set an executable is compiled for (part of the cache key)."""

    platform: str
    device_kind: str
    device_count: int
    topology: str = ""  # set for deviceless compiles only; not part of the key, so entries match real TPUs

    @property
    def runnable(self) -> bool:
        return not self.topology


@contextlib.contextmanager
def deviceless_tpu(topology: str):
    """Within this block, graphs are compiled for TPU `topology` (e.g. "v5e:2x2")."""
    global _topology
    topology_devices(topology)  # fail early: libtpu missing or unknown topology
    previous, _topology = _topology, topology
    try:
        yield
    finally:
        _topology = previous


@functools.cache
def topology_devices(topology: str) -> tuple:
    # libtpu takes a machine-wide lock file meant for processes that own TPU chips; a
    # deviceless compile owns none, and prewarm --jobs runs several such processes.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(topology, "tpu").devices)


def resolve(options) -> tuple[Target, "jax.Device"]:
    """(Target, device) for `options`: the deviceless topology when one is active, else the
    process's platform (options.platform overrides)."""
    if _topology is not None:
        devices = topology_devices(_topology)
        return Target("tpu", devices[0].device_kind, len(devices), _topology), devices[0]
    name = options.platform or platforms.default_platform()
    device = platforms.device(name)
    return Target(name, device.device_kind, len(jax.devices(name))), device
