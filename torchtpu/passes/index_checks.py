"""The index_checks pass: marks every node that reads or writes at positions taken from tensor
values with the bounds torch checks for the op the user called.

XLA clamps an out-of-range gather and drops an out-of-range scatter, so without a check a bad
token id gives silent garbage where eager raises. The lowering (compiler/checks.py) reduces each
marked node's indices into the program's one check flag, and the runtime raises torch's error.

The bounds are those of the op the user called (`meta["original_aten"]`), not of the op it was
decomposed into: `index_copy` and `index_add` become `index_put`, which wraps negative positions
where they reject them, and `nll_loss` becomes a `gather`, which raises RuntimeError where the
loss raises IndexError. The mark is printed into the cache key (cache/canonical.py), so two
graphs that differ only in that provenance never share a program.
"""
from __future__ import annotations

import dataclasses

import torch

from torchtpu.plans import CHECK

aten = torch.ops.aten



@dataclasses.dataclass(frozen=True)
class IndexCheck:
    """Attributes:
        op: the op the user called (the node's original_aten, else its target).
        error: what torch raises for it: "IndexError" or "RuntimeError".
        message: torch's message; `{dim}` and `{size}` are filled in at lowering.
        negative: positions in [-size, 0) count from the end (else only [0, size) is valid).
        sites: (index path, operand path, dim) per index tensor: paths into the node's args
            ((1,) is args[1], (1, 0) is args[1][0]); dim None checks against the operand's numel.
    """

    op: str
    error: str
    message: str
    negative: bool
    sites: tuple


_RANGE = "index out of range in self"
_BOUNDS = "index out of bounds for dimension {dim} with size {size}"
_OUTSIDE = "out of range: tried to access index outside [-{size}, {size}) on a tensor of {size} elements."

# the op the user called -> (error, message, negative positions allowed), as eager torch raises
_TORCH = {
    aten.embedding.default: ("IndexError", _RANGE, False),
    aten.index_select.default: ("IndexError", _RANGE, False),
    aten.index_reduce.default: ("IndexError", _RANGE, False),
    aten.gather.default: ("RuntimeError", _BOUNDS, False),
    aten.index_add.default: ("RuntimeError", _BOUNDS, False),
    aten.index_copy.default: ("IndexError", "index_copy_(): " + _BOUNDS, False),
    aten.index.Tensor: ("IndexError", _BOUNDS, True),
    aten.index_put.default: ("IndexError", _BOUNDS, True),
    aten.take.default: ("IndexError", _OUTSIDE, True),
    aten.put.default: ("IndexError", _OUTSIDE, True),
    aten.nll_loss_forward.default: ("IndexError", "Target is out of bounds.", False),
    aten.nll_loss2d_forward.default: ("IndexError", "Target is out of bounds.", False),
    aten._embedding_bag.default: ("RuntimeError", "Index of input takes a value not in the valid range [0, {size})",
                                  False),
}
for _op in (aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
            aten.scatter_add.default, aten.scatter_reduce.two):
    _TORCH[_op] = _TORCH[aten.gather.default]
_TORCH[aten.index.Tensor_hacked_twin] = _TORCH[aten.index.Tensor]
_TORCH[aten.index_put.hacked_twin] = _TORCH[aten.index_put.default]
_TORCH[aten._embedding_bag_forward_only.default] = _TORCH[aten._embedding_bag.default]
# by name: the original_aten that tracing records can be another OpOverload object of the same op
_TORCH = {str(op): kind for op, kind in _TORCH.items()}


def _dim_arg(node):
    """(x, dim, index, ...): one index tensor along `dim`."""
    return (((2,), (0,), node.args[1]),)


def _advanced_sites(node):
    """index / index_put: one site per integer index tensor; a boolean mask covers its ndim dims."""
    sites, d = [], 0
    for k, idx in enumerate(node.args[1]):
        val = idx.meta.get("val") if isinstance(idx, torch.fx.Node) else None
        if idx is not None and val is not None and val.dtype == torch.bool:
            d += val.ndim
            continue
        if idx is not None:
            sites.append(((1, k), (0,), d))
        d += 1
    return tuple(sites)


# the lowered op -> where its index tensors and their operands are (unsafe_* ops are unchecked in torch)
_SITES = {
    aten.embedding.default: lambda n: (((1,), (0,), 0),),
    aten._embedding_bag.default: lambda n: (((1,), (0,), 0),),
    aten._embedding_bag_forward_only.default: lambda n: (((1,), (0,), 0),),
    aten.take.default: lambda n: (((1,), (0,), None),),
    aten.put.default: lambda n: (((1,), (0,), None),),
    aten.index.Tensor: _advanced_sites,
    aten.index.Tensor_hacked_twin: _advanced_sites,
    aten.index_put.default: _advanced_sites,
    aten.index_put.hacked_twin: _advanced_sites,
}
for _op in (aten.index_select.default, aten.index_reduce.default, aten.gather.default, aten.scatter.src,
            aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter_add.default,
            aten.scatter_reduce.two):
    _SITES[_op] = _dim_arg


def check_for(node: torch.fx.Node) -> IndexCheck | None:
    """The bounds check `node` needs, or None (no tensor positions, or a backward op: its
    indices come from the forward, where they were checked)."""
    sites = _SITES.get(node.target)
    if sites is None:
        return None
    user = str(node.meta.get("original_aten") or node.target)
    if "backward" in user:
        return None
    error, message, negative = _TORCH.get(user) or _TORCH[str(node.target)]  # index_fill: index_put's
    return IndexCheck(user, error, message, negative, sites(node))


def mark_index_checks(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    """The pass (see module docstring); does nothing with option check_indices=False."""
    if not getattr(options, "check_indices", True):
        return gm
    for node in gm.graph.nodes:
        if node.op == "call_function":
            check = check_for(node)
            if check is not None:
                node.meta[CHECK] = check
    return gm
