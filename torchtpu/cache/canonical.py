"""A canonical text of an ATen FX graph: the same program prints the same text in any process.

Node names, stack traces and other metadata that does not change the program are left out;
constants (get_attr) are replaced by a digest of their contents. Anything we cannot print
faithfully raises Unkeyable: such a graph bypasses the cache rather than risk a collision.
"""
from __future__ import annotations

import enum
import hashlib
import math

import torch
import torch.fx

from torchtpu.plans import CHECK


class Unkeyable(Exception):
    """The graph or signature has a part that cannot be keyed reliably."""


def canonical_graph(gm: torch.fx.GraphModule) -> str:
    index: dict[torch.fx.Node, str] = {}
    lines = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = f"%{i}"
        args = _fmt(node.args, index)
        kwargs = _fmt(dict(sorted(node.kwargs.items())), index)
        lines.append(f"%{i} = {node.op} {_target(gm, node)}{args} {kwargs} :: {_fmt_val(node.meta.get('val'))}"
                     + _program_meta(node))
    return "\n".join(lines)


def _program_meta(node) -> str:
    """Metadata that changes the program: the bounds the index_checks pass chose from the op the
    user called (index_copy and index_put lower alike but check differently)."""
    check = node.meta.get(CHECK)
    return f" check {check!r}" if check is not None else ""


def _target(gm, node) -> str:
    if node.op in ("placeholder", "output"):
        return ""
    if node.op == "get_attr":
        return constant_digest(_getattr(gm, node.target))
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_function":
        return callable_name(node.target)
    raise Unkeyable(f"FX node kind {node.op!r} ({node.format_node()})")


def _getattr(gm, target: str):
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def callable_name(fn) -> str:
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(fn)
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:  # lambdas and closures print alike
        raise Unkeyable(f"call target {fn!r} has no stable name")
    return f"{module}.{qualname}"


def constant_digest(value) -> str:
    if isinstance(value, torch.fx.GraphModule):
        return "graph:" + hashlib.sha256(canonical_graph(value).encode()).hexdigest()
    if isinstance(value, torch.Tensor):
        if value.is_sparse or value.is_quantized or value.device.type == "meta" or \
                isinstance(value, torch._subclasses.FakeTensor):
            raise Unkeyable(f"constant tensor without readable contents ({value.dtype}, {value.layout})")
        raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # any dtype, empty too
        digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest()
        return f"tensor:{value.dtype}{list(value.shape)}{list(value.stride())}:{digest}"
    return "value:" + _fmt(value, {})


def _fmt(x, index) -> str:
    if isinstance(x, torch.fx.Node):
        return index[x]
    if x is None or isinstance(x, (bool, str)):
        return repr(x)
    if isinstance(x, int):
        return f"{x}i"
    if isinstance(x, float):
        return f"{x!r}f" if math.isfinite(x) else f"{x}f"
    if isinstance(x, complex):
        return f"{x!r}"
    if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(x)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym({x})"
    if isinstance(x, enum.Enum):
        return f"{type(x).__name__}.{x.name}"
    if isinstance(x, slice):
        return f"slice({_fmt(x.start, index)},{_fmt(x.stop, index)},{_fmt(x.step, index)})"
    if isinstance(x, (list, tuple)):
        open_, close = ("[", "]") if isinstance(x, list) else ("(", ")")
        return open_ + ",".join(_fmt(v, index) for v in x) + close
    if isinstance(x, dict):
        return "{" + ",".join(f"{k!r}:{_fmt(v, index)}" for k, v in x.items()) + "}"
    raise Unkeyable(f"argument of type {type(x).__name__}")


def _fmt_val(val) -> str:
    """The traced value's type: the output layout (strides) is read from it at lowering."""
    if isinstance(val, torch.Tensor):
        shape = ",".join(str(s) for s in val.shape)
        try:
            stride = ",".join(str(s) for s in val.stride())
        except RuntimeError:
            stride = "?"
        return f"{val.dtype}[{shape}]/[{stride}]"
    if isinstance(val, (list, tuple)):
        return "(" + ",".join(_fmt_val(v) for v in val) + ")"
    if val is None or isinstance(val, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _fmt(val, {})
    return type(val).__name__
