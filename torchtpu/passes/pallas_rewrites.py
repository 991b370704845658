"""Pallas pattern rewrites: decomposed RMSNorm -> one `torchtpu.rms_norm` node.

AOTAutograd leaves RMSNorm (torch.nn.RMSNorm, F.rms_norm, HF LlamaRMSNorm, hand-written
`x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w`) as five or six ATen ops:

    pow(x, 2) -> mean([-1], keepdim) -> add(eps) -> rsqrt -> mul(x, rsqrt)
        [-> convert_element_type] [-> mul(weight)]

The pass replaces the chain with `torchtpu.rms_norm(x, weight, eps) -> (y, rstd)`, whose rule
chooses the Pallas kernel or XLA per target (torchtpu/kernels). Only the forward graph has
this pattern. Its backward stays the decomposed ATen graph AOTAutograd derived: it reads
the saved `rsqrt`, which the fused node still produces (its second output replaces every
other use of `rsqrt`), so forward and backward agree by construction.

Other fused ops that exist in both graphs (SDPA fwd/bwd, native_layer_norm fwd/bwd) need
no rewrite: their rules choose the kernel.

Skipped (left as is): a chain whose intermediates are used elsewhere, a mean over a dim
that carries bucket padding, a weight that is not 1-D of the normalised size.
"""
from __future__ import annotations

import operator

import torch

from torchtpu.kernels import ops as fused_ops  # noqa: F401  (defines torch.ops.torchtpu.rms_norm)
from torchtpu.passes.bucketing import MASK

aten, prims = torch.ops.aten, torch.ops.prims
RMS_NORM = torch.ops.torchtpu.rms_norm.default


def fuse_rms_norm(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    """The pass (see module docstring); off with option pallas='off'."""
    if getattr(options, "pallas", "auto") == "off":
        return gm
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    matches = [m for n in gm.graph.nodes if (m := _match(n, order)) is not None]
    for m in matches:
        _rewrite(gm.graph, m)
    if matches:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _is(node, *targets):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _other(mul, node):
    a, b = mul.args[:2]
    return b if a is node else a if b is node else None


def _match(rsqrt, order):
    """The RMSNorm chain ending at this rsqrt node, as a dict, or None."""
    if not _is(rsqrt, aten.rsqrt.default):
        return None
    add = rsqrt.args[0]
    if not (_is(add, aten.add.Tensor, aten.add.Scalar) and len(add.users) == 1
            and isinstance(add.args[1], float)):
        return None
    mean = add.args[0]
    if not (_is(mean, aten.mean.dim) and len(mean.users) == 1 and MASK not in mean.meta):
        return None
    pow_ = mean.args[0]
    if not (_is(pow_, aten.pow.Tensor_Scalar) and pow_.args[1] == 2 and len(pow_.users) == 1):
        return None
    x = pow_.args[0]
    xv = _val(x)
    if not isinstance(xv, torch.Tensor) or not isinstance(xv.shape[-1], int) or not xv.ndim:
        return None
    dims, keepdim = list(mean.args[1]), (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim"))
    if dims not in ([-1], [xv.ndim - 1]) or not keepdim:
        return None
    norm = next((u for u in rsqrt.users if _is(u, aten.mul.Tensor) and _other(u, rsqrt) is x), None)
    if norm is None:
        return None
    final, weight, prev = norm, None, norm
    step = next(iter(norm.users)) if len(norm.users) == 1 else None
    if _is(step, prims.convert_element_type.default) and len(step.users) == 1:
        prev, step = step, next(iter(step.users))
    if _is(step, aten.mul.Tensor):
        w = _other(step, prev)
        wv, sv = _val(w), _val(step)
        if isinstance(wv, torch.Tensor) and tuple(wv.shape) == (xv.shape[-1],) \
                and sv.dtype == wv.dtype and tuple(sv.shape) == tuple(xv.shape):
            final, weight = step, w
    if weight is None and _val(norm).dtype != xv.dtype:
        return None
    anchor = max([rsqrt] + ([weight] if weight is not None else []), key=order.get)
    others = [u for u in rsqrt.users if u is not norm]
    if any(order[u] <= order[anchor] for u in others):
        return None  # the fused node could not precede every other reader of rsqrt
    return dict(x=x, weight=weight, eps=add.args[1], rsqrt=rsqrt, norm=norm, final=final, anchor=anchor)


def _rewrite(graph, m):
    final, rsqrt = m["final"], m["rsqrt"]
    with graph.inserting_after(m["anchor"]):
        fused = graph.call_function(RMS_NORM, (m["x"], m["weight"], m["eps"]))
    with graph.inserting_after(fused):
        rstd = graph.call_function(operator.getitem, (fused, 1))
    with graph.inserting_after(fused):
        y = graph.call_function(operator.getitem, (fused, 0))
    fused.meta.update({k: v for k, v in final.meta.items() if k in ("stack_trace", "nn_module_stack")})
    fused.meta["val"] = (final.meta["val"], rsqrt.meta["val"])
    y.meta["val"], rstd.meta["val"] = final.meta["val"], rsqrt.meta["val"]
    final.replace_all_uses_with(y)
    # The chain's own reader of rsqrt may precede the fused node (a weight computed late, as
    # Gemma's `1 + w`): it is dead now, so it keeps rsqrt and goes with the dead chain.
    rsqrt.replace_all_uses_with(rstd, delete_user_cb=lambda user: user is not m["norm"])
