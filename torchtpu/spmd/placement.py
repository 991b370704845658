"""Where each input of a graph lives on the mesh, and putting torch tensors there.

Parameters take the tp_plan's sharding; every other tensor input (the user's data, saved
activations and gradients in the backward) has its first dimension split over "dp" when it
divides evenly, else is replicated. Any choice is correct: XLA's SPMD partitioner inserts the
communication a sharding needs. Tensors are placed shard by shard, so no device ever holds a
whole sharded weight; parameters are placed once and stay resident while unchanged.
"""
from __future__ import annotations

import dataclasses

import jax
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from torchtpu.compiler.spec import TensorSpec
from torchtpu.runtime import residency, transfer
from torchtpu.runtime import target as targets
from torchtpu.spmd import plan as plans
from torchtpu.spmd.inputs import GraphInputs, Param
from torchtpu.spmd.mesh import build_mesh


@dataclasses.dataclass
class Placement:
    """The mesh and the Param (or None) of each placeholder of one AOTAutograd graph."""

    mesh: jax.sharding.Mesh
    params: list[Param | None]
    plan: dict

    def sharding(self, index: int, spec: TensorSpec) -> tuple[NamedSharding, str]:
        """The sharding of placeholder `index` with signature `spec`, and the reason for it."""
        param = self.params[index] if index < len(self.params) else None
        shape = tuple(spec.shape)
        if param is not None:
            spec_, why = self._param_spec(param, shape)
        else:
            spec_, why = _data_spec(shape, self.mesh.shape.get("dp", 1))
        return NamedSharding(self.mesh, spec_), why

    def _param_spec(self, param: Param, shape) -> tuple[P, str]:
        module, _, leaf = param.name.rpartition(".")
        found = plans.style_for(module, self.plan)
        if found is None:
            return P(), "not in tp_plan, replicated"
        pattern, style = found
        if "tp" not in self.mesh.shape:
            raise ValueError(f"torchtpu: tp_plan[{pattern!r}] splits {param.name} over 'tp', but the mesh "
                             f"{dict(self.mesh.shape)} has no tp axis")
        spec_, why = plans.partition_spec(style, leaf, shape, param.embedding, self.mesh.shape["tp"])
        return spec_, f"{why} ({pattern!r})"

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())


def placement_for(gm: torch.fx.GraphModule, options, inputs: GraphInputs | None, target) -> Placement | None:
    """The Placement of an AOTAutograd graph when `options.mesh` is set, else None.

    Args:
        gm: the forward, backward or inference graph.
        options: backend Options (mesh).
        inputs: what the Dynamo graph's inputs are (None: no parameter is known, all data).
        target: the runtime Target: its platform's devices (every process's under
            jax.distributed), or a TPU topology's for a deviceless compile.
    """
    if options.mesh is None:
        return None
    devices = jax.devices(target.platform) if target.runnable else targets.topology_devices(target.topology)
    mesh = build_mesh(options.mesh, devices)
    if inputs is None:
        return Placement(mesh, [], {})
    return Placement(mesh, inputs.for_graph(gm), inputs.plan)


def _data_spec(shape, dp: int) -> tuple[P, str]:
    if dp == 1 or not shape:
        return P(), "replicated"
    if shape[0] % dp:
        return P(), f"dim 0 of size {shape[0]} does not split {dp} ways, replicated"
    return P("dp"), "batch over dp"


def put(t: torch.Tensor, sharding: NamedSharding) -> jax.Array:
    """A global array with `t`'s values, built from per-device slices of `t` (this process's
    devices only): no device receives more than its shard."""
    t = t.detach()
    pieces = [transfer.to_device(t[index], device)
              for device, index in sharding.addressable_devices_indices_map(tuple(t.shape)).items()]
    return jax.make_array_from_single_device_arrays(tuple(t.shape), sharding, pieces)


def put_input(t: torch.Tensor, sharding: NamedSharding, is_param: bool) -> jax.Array:
    """Parameters stay resident (placed once per version of the tensor); data is placed per call."""
    if is_param:
        return residency.resident(t, sharding, lambda x: put(x, sharding))
    return put(t, sharding)


def gather(array: jax.Array, like: torch.device | None) -> torch.Tensor:
    """A program result as one torch tensor (gathered from its shards, across processes if need be)."""
    if array.is_fully_replicated:
        return transfer.to_torch(array.addressable_shards[0].data, like)
    if array.is_fully_addressable:
        return transfer.to_torch(jax.device_put(array, array.addressable_shards[0].device), like)
    from jax.experimental import multihost_utils

    whole = multihost_utils.process_allgather(array, tiled=True)
    return transfer.to_torch(jax.device_put(whole, jax.local_devices()[0]), like)
