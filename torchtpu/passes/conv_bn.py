"""Convolution -> eval-mode BatchNorm [-> ReLU] as one `torchtpu.conv_bn` node.

Inference graphs of CNNs (a module in `.eval()`) carry

    convolution(x, w, b) -> _native_batch_norm_legit_no_training(...)[0] [-> relu]

and XLA runs the normalisation (and ReLU) as a separate pass over the convolution's output.
The fused node lets the CPU rule fold the normalisation into the convolution's weights and
bias and have oneDNN apply the bias and ReLU as it writes the result (compiler/rules/conv.py,
docs/DECISIONS.md 44); elsewhere the rule lowers the three ops as before. Training graphs
normalise with batch statistics (`_native_batch_norm_legit_functional`) and are left alone,
as is a chain whose convolution or normalised output has another reader.
"""
from __future__ import annotations

import operator

import torch

from torchtpu.kernels import ops as fused_ops  # noqa: F401  (defines torch.ops.torchtpu.conv_bn)

aten = torch.ops.aten
CONV_BN = torch.ops.torchtpu.conv_bn.default


def fuse_conv_bn(gm: torch.fx.GraphModule, options) -> torch.fx.GraphModule:
    """The pass (see module docstring)."""
    matches = [m for n in gm.graph.nodes if (m := _match(n)) is not None]
    for bn, conv, final, relu in matches:
        x, w, b, stride, padding, dilation, _, _, groups = conv.args
        _, bn_w, bn_b, mean, var, _, eps = bn.args
        with gm.graph.inserting_before(final):
            fused = gm.graph.call_function(CONV_BN, (x, w, b, bn_w, bn_b, mean, var, eps, list(stride),
                                                     list(padding), list(dilation), groups, relu))
        fused.meta.update({k: v for k, v in final.meta.items() if k in ("val", "stack_trace", "nn_module_stack")})
        final.replace_all_uses_with(fused)
    if matches:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def _match(bn):
    """(bn, conv, final node, relu?) for a fusable chain ending at this BatchNorm, else None."""
    if not (bn.op == "call_function" and bn.target is aten._native_batch_norm_legit_no_training.default
            and len(bn.args) == 7 and not bn.kwargs):
        return None
    conv = bn.args[0]
    if not (isinstance(conv, torch.fx.Node) and conv.target is aten.convolution.default
            and not conv.args[6] and len(conv.users) == 1 and len(conv.args) == 9):
        return None
    if any(u.target is not operator.getitem for u in bn.users):
        return None
    readers = [u for u in bn.users if u.users]
    if len(readers) != 1 or readers[0].args[1] != 0:
        return None
    out = readers[0]
    relu = next(iter(out.users)) if len(out.users) == 1 else None
    if relu is not None and relu.target is aten.relu.default:
        return bn, conv, relu, True
    return bn, conv, out, False
