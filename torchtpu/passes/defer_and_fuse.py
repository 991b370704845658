"""DeferAndFuse: split an ATen graph into the fewest device programs its host ops allow.

Every call_function node is one of three kinds:
- "device": it has a lowering rule and is not host-only; it runs inside a device program;
- "host": the device cannot run it (no rule, a host sync, a data-dependent output shape, a
  node that binds new unbacked symbols); it runs in eager torch between device programs;
- "glue": a scalar computed from host values (a size of a host tensor, SymInt arithmetic,
  runtime asserts on them); evaluated on the host, free, not a fallback op.

Regions are formed by levels over the dependency DAG (networkx): device nodes sit on even
levels 0, 2, 4, ... (region k at level 2k) as early as their inputs allow — independent device
work is hoisted across host ops — and host nodes on odd levels, as late as their users allow
(deferred). Levels never decrease along an edge, so regions cannot form a cycle, and the
number of regions is one more than the longest chain of host ops between device work: the
fewest the dependencies allow.
"""
from __future__ import annotations

import dataclasses
import operator

import networkx as nx
import torch

from torchtpu.compiler import registry

aten = torch.ops.aten

DEVICE, HOST, GLUE = "device", "host", "glue"

# Ops with a rule that only raises (compiler/rules/host.py) or none: their results are known
# only after running them, on the host.
HOST_ONLY = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
    aten._unique.default, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default, aten.unique_dim_consecutive.default,
}


@dataclasses.dataclass
class Region:
    """One device program: its nodes (graph order), the values it reads and the ones it hands on."""

    index: int
    nodes: list[torch.fx.Node]
    inputs: list[torch.fx.Node]
    outputs: list[torch.fx.Node]


@dataclasses.dataclass
class Partition:
    """The execution plan: `steps` in order, each ("host", node) or ("region", Region)."""

    kinds: dict[torch.fx.Node, str]
    regions: list[Region]
    steps: list[tuple[str, object]]
    host_ops: list[str]  # the fallback ops (kind "host"), graph order
    transfers: int  # tensors crossing host<->device per call (see transfer_count)
    naive_regions: int  # the count without hoisting (program order cut at each host op)


def is_tensor_node(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) for v in vals)


def _is_host_op(node: torch.fx.Node) -> bool:
    target = node.target
    if target is torch.ops.higher_order.with_effects:
        target = node.args[1]
    if target in HOST_ONLY or node.meta.get("unbacked_bindings"):
        return True
    return isinstance(target, torch._ops.OpOverload) and registry.lookup(target) is None


def classify(gm: torch.fx.GraphModule, strict: bool = False) -> dict[torch.fx.Node, str]:
    """The kind of every call_function node (graph order).

    Args:
        gm: the ATen graph.
        strict: every scalar (non-tensor) node is glue, so that each op stands alone.

    Returns:
        node -> "device" | "host" | "glue".
    """
    kinds: dict[torch.fx.Node, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        producers = [kinds.get(a) for a in node.all_input_nodes]
        if _is_host_op(node):
            kinds[node] = HOST
        elif node.target is operator.getitem:  # part of a multi-output node: goes where it goes
            kinds[node] = GLUE if producers[0] in (HOST, GLUE) else DEVICE
        elif not is_tensor_node(node) and (strict or any(k in (HOST, GLUE) for k in producers)):
            kinds[node] = GLUE  # a scalar the host can compute from values it has
        else:
            kinds[node] = DEVICE
    return kinds


def has_host_ops(gm: torch.fx.GraphModule) -> bool:
    return any(kind == HOST for kind in classify(gm).values())


def applies(gm: torch.fx.GraphModule, options) -> bool:
    """Whether the graph is partitioned: it has host ops and fallback="defer", or mode="strict".
    With fallback="error", a graph with host ops goes on to lowering, which names the op."""
    if has_host_ops(gm):
        return options.fallback == "defer"
    return options.mode == "strict"


def dependency_graph(gm: torch.fx.GraphModule) -> nx.DiGraph:
    """The call_function nodes and their data edges."""
    dag = nx.DiGraph()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            dag.add_node(node)
            dag.add_edges_from((a, node) for a in node.all_input_nodes if a.op == "call_function")
    return dag


def levels(dag: nx.DiGraph, kinds: dict) -> dict[torch.fx.Node, int]:
    """Device nodes as early as possible on even levels, host nodes as late as possible on odd.

    Args:
        dag: the dependency graph (dependency_graph).
        kinds: classify's result.

    Returns:
        node -> level; region k is the device nodes at level 2k. Host and glue nodes with no
        device work before them get level -1 (before region 0).
    """
    order = list(nx.topological_sort(dag))
    level: dict = {}
    for node in order:  # earliest levels
        need = -1
        for p in dag.predecessors(node):
            crossing = (kinds[p] == DEVICE) != (kinds[node] == DEVICE)
            need = max(need, level[p] + (1 if crossing else 0))
        level[node] = _round_up(need, even=kinds[node] == DEVICE)
    last = max([lv for n, lv in level.items() if kinds[n] == DEVICE], default=-2) + 1
    for node in reversed(order):  # defer host work to just before its first device user
        if kinds[node] == DEVICE:
            continue
        late = last
        for s in dag.successors(node):
            late = min(late, level[s] - 1 if kinds[s] == DEVICE else level[s])
        level[node] = max(level[node], late)
    return level


def _round_up(n: int, even: bool) -> int:
    if even:
        return max(0, n + (n % 2))
    return n if n % 2 else n + 1


def partition(gm: torch.fx.GraphModule, strict: bool = False) -> Partition:
    """Forms the device regions and the order of host and device steps.

    Args:
        gm: the ATen graph.
        strict: one region per device op (the one-op-at-a-time baseline).

    Returns:
        The Partition.
    """
    kinds = classify(gm, strict)
    dag = dependency_graph(gm)
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    # Strict: graph position is the schedule, one region per op. Fused: the levels.
    level = index if strict else levels(dag, kinds)
    if strict:
        groups = _one_per_op(gm, kinds)
    else:
        by_level: dict[int, list] = {}
        for node, kind in kinds.items():
            if kind == DEVICE:
                by_level.setdefault(level[node], []).append(node)
        groups = [sorted(by_level[lv], key=index.get) for lv in sorted(by_level)]
    regions = [_region(i, nodes) for i, nodes in enumerate(groups)]
    _check_acyclic(dag, regions)
    steps = _schedule(kinds, regions, level, index)
    host_ops = [str(n.target) for n, k in kinds.items() if k == HOST]
    return Partition(kinds, regions, steps, host_ops, transfer_count(kinds, regions),
                     naive_region_count(gm, kinds))


def _one_per_op(gm, kinds) -> list[list]:
    groups: list[list] = []
    owner: dict = {}
    for node in gm.graph.nodes:
        if kinds.get(node) != DEVICE:
            continue
        if node.target is operator.getitem:
            owner[node] = owner[node.args[0]]
            groups[owner[node]].append(node)
        else:
            owner[node] = len(groups)
            groups.append([node])
    return groups


def _region(i: int, nodes: list) -> Region:
    inside = set(nodes)
    inputs: dict = {}
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in inside:
                inputs.setdefault(a, None)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    return Region(i, nodes, list(inputs), outputs)


def _check_acyclic(dag: nx.DiGraph, regions: list[Region]) -> None:
    """Invariant: contracting each region to one node leaves a DAG (each runs once, whole)."""
    owner = {n: f"region{r.index}" for r in regions for n in r.nodes}
    contracted = nx.DiGraph()
    contracted.add_nodes_from(owner.get(n, n) for n in dag.nodes)
    contracted.add_edges_from((owner.get(a, a), owner.get(b, b)) for a, b in dag.edges
                              if owner.get(a, a) != owner.get(b, b))
    if not nx.is_directed_acyclic_graph(contracted):
        raise AssertionError("DeferAndFuse formed regions with a cycle between them")


def _schedule(kinds, regions, level, index) -> list[tuple[str, object]]:
    """Steps in run order: by level, graph order within one level. A region runs at the place
    of its first node (all its nodes share a level, or it is one op)."""
    region_of = {n: r for r in regions for n in r.nodes}
    items = []
    for node, kind in kinds.items():
        if kind != DEVICE:
            items.append(((level[node], index[node]), ("host", node)))
        elif node is region_of[node].nodes[0]:
            items.append(((level[node], index[node]), ("region", region_of[node])))
    return [step for _, step in sorted(items, key=lambda item: item[0])]


def transfer_count(kinds, regions: list[Region]) -> int:
    """Tensors that cross between host ops and device programs on each call.

    A device tensor read by host ops counts once; a host tensor counts once per region that
    reads it. Graph inputs, constants and outputs are not counted (every compiled graph has
    them), nor values handed from one region to the next (they stay on the device).
    """
    host_reads = {a for n, k in kinds.items() if k != DEVICE for a in n.all_input_nodes}
    down = sum(1 for r in regions for n in r.outputs if n in host_reads and is_tensor_node(n))
    up = sum(1 for r in regions for a in r.inputs if kinds.get(a) in (HOST, GLUE) and is_tensor_node(a))
    return down + up


def naive_region_count(gm: torch.fx.GraphModule, kinds: dict) -> int:
    """Regions without hoisting: runs of device ops in program order, cut at every host op."""
    count, in_run = 0, False
    for node in gm.graph.nodes:
        kind = kinds.get(node)
        if kind == DEVICE and not in_run:
            count, in_run = count + 1, True
        elif kind == HOST:
            in_run = False
    return count


def region_module(gm: torch.fx.GraphModule, region: Region) -> torch.fx.GraphModule:
    """The region as a GraphModule: one placeholder per input, a tuple of its outputs."""
    graph = torch.fx.Graph()
    env: dict = {}
    for a in region.inputs:
        ph = graph.placeholder(a.name)
        ph.meta["val"] = a.meta.get("val")
        env[a] = ph
    for node in region.nodes:
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[n] for n in region.outputs))
    graph.lint()
    return torch.fx.GraphModule(gm, graph, f"region{region.index}")
