"""Tensor and data parallelism: shardings on a jax Mesh, partitioned by XLA (GSPMD/Shardy).

`torch.compile(model, backend="tpu", options={"mesh": {"dp": 2, "tp": 4}, "tp_plan": "auto"})`.
See docs/spmd.md.
"""
from torchtpu.spmd.executable import (ShardedExecutable, count_collectives, describe, sharded_avals,
                                      sharded_executable)
from torchtpu.spmd.inputs import GraphInputs, Param, graph_inputs
from torchtpu.spmd.mesh import build_mesh, parse_mesh
from torchtpu.spmd.placement import Placement, placement_for
from torchtpu.spmd.plan import auto_plan, parse_plan

__all__ = ["ShardedExecutable", "count_collectives", "describe", "sharded_avals", "sharded_executable",
           "GraphInputs", "Param", "graph_inputs", "build_mesh", "parse_mesh", "Placement", "placement_for",
           "auto_plan", "parse_plan"]
