"""Which graph inputs are which parameters.

With Dynamo's inlined nn modules, parameters and buffers reach the backend as graph inputs;
each placeholder of Dynamo's graph carries its source, e.g.
`L['self']._modules['layers']._modules['0']._modules['q_proj']._parameters['weight']`, from
which the parameter's dotted name follows. AOTAutograd keeps that input order (after any
parameters Dynamo left on the graph module itself) and names the placeholders of its graphs
`primals_K` (training forward, and primals saved for the backward) or `argK_1` (inference),
which maps them back to the Dynamo input they stand for.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from torchtpu.spmd import plan as plans

_STEP = re.compile(r"\._(modules|parameters|buffers)\['([^']*)'\]")
_AOT_NAME = re.compile(r"(?:primals_(\d+)|arg(\d+)_1)\Z")


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter or buffer that is a graph input."""

    name: str  # dotted name in the root module, e.g. "model.layers.0.mlp.up_proj.weight"
    embedding: bool  # its module is an nn.Embedding (the weight is [rows, dim])


@dataclasses.dataclass(frozen=True)
class GraphInputs:
    """Per input of AOTAutograd's forward (in order): the Param it is, or None for data.

    Args:
        params: one entry per forward input.
        plan: the resolved tp_plan {pattern: style} ("auto" already read from the model).
    """

    params: tuple[Param | None, ...]
    plan: dict

    def for_graph(self, gm: torch.fx.GraphModule) -> list[Param | None]:
        """The Param of each placeholder of an AOTAutograd graph (forward, backward or inference)."""
        out = []
        for node in gm.graph.find_nodes(op="placeholder"):
            index = _forward_index(node.name)
            out.append(self.params[index] if index is not None and index < len(self.params) else None)
        return out


def _forward_index(placeholder: str) -> int | None:
    """The forward input a placeholder stands for: primals_K -> K-1, argK_1 -> K, else None
    (activations saved for the backward, tangents)."""
    m = _AOT_NAME.match(placeholder)
    if m is None:
        return None
    return int(m.group(1)) - 1 if m.group(1) else int(m.group(2))


def graph_inputs(gm: torch.fx.GraphModule, tp_plan) -> GraphInputs:
    """Names the parameters among a Dynamo graph's inputs and resolves `tp_plan`.

    Args:
        gm: Dynamo's graph, as handed to the backend.
        tp_plan: the parsed option (None, "auto" or ((pattern, style), ...)).

    Returns:
        GraphInputs in AOTAutograd's forward input order.
    """
    root = _root_module(gm)
    lifted_names = gm.meta.get("dynamo_flat_name_to_original_fqn", {})
    params: list[Param | None] = []
    # aot_module_simplified puts parameters and buffers still on the graph module first
    for attr, _ in [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]:
        name = lifted_names.get(attr)
        params.append(None if name is None else Param(name, _is_embedding(root, name)))
    for node in gm.graph.find_nodes(op="placeholder"):
        name = _param_name(node)
        params.append(None if name is None else Param(name, _is_embedding(root, name)))
    return GraphInputs(tuple(params), _resolve_plan(tp_plan, root))


def _param_name(node: torch.fx.Node) -> str | None:
    """'a.b.weight' from a source `...._modules['a']._modules['b']._parameters['weight']`."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return None
    text = _source_name(source)
    steps = list(_STEP.finditer(text))
    if not steps or steps[-1].group(1) == "modules" or steps[-1].end() != len(text):
        return None
    return ".".join(m.group(2) for m in steps)


def _source_name(source) -> str:
    return source.name if isinstance(source.name, str) else source.name()  # a property in torch 2.13


def _resolve_plan(tp_plan, root) -> dict:
    if tp_plan is None:
        return {}
    if tp_plan != "auto":
        return dict(tp_plan)
    if root is None:
        raise ValueError("torchtpu: tp_plan='auto' reads the compiled model's own plan, but this graph's "
                         "parameters do not come from one nn.Module; pass tp_plan={pattern: style}")
    return plans.auto_plan(root)


def _root_module(gm) -> torch.nn.Module | None:
    """The nn.Module the parameters' sources start from (`L['self']`, `L['args'][0]`, ...).

    Evaluated in the frame Dynamo traced, the way Dynamo's own guards evaluate source names.
    """
    from torch._dynamo.symbolic_convert import InstructionTranslator

    tx = InstructionTranslator.current_tx()
    if tx is None:
        return None
    for node in gm.graph.find_nodes(op="placeholder"):
        if _param_name(node) is None:
            continue
        text = _source_name(node.meta["grapharg"].source)
        base = text[: _STEP.search(text).start()]
        try:
            root = eval(base, {"L": tx.f_locals, "G": tx.f_globals})  # noqa: S307 — a Dynamo source name
        except Exception:  # noqa: BLE001 — an unusual source: no root, "auto" then asks for a dict
            return None
        return root if isinstance(root, torch.nn.Module) else None
    return None


def _is_embedding(root, name: str) -> bool:
    if root is None or "." not in name:
        return False
    try:
        return isinstance(root.get_submodule(name.rsplit(".", 1)[0]), torch.nn.Embedding)
    except AttributeError:
        return False
