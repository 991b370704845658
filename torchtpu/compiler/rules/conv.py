"""Convolutions (1d/2d/3d, grouped, dilated, transposed) as lax.conv_general_dilated.

The backward op is the VJP of the forward rule, so the two can never disagree; on the CPU
with ATen's kernels (kernels/aten_cpu.py) both directions are ATen's own, which agree as well.
"""
from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax
import torch

from torchtpu.compiler import dtypes
from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.linalg import precision
from torchtpu.compiler.rules.nn import _batch_norm_eval
from torchtpu.compiler.rules.reduction import accumulate_dtype, sum_
from torchtpu.kernels import aten_cpu
from torchtpu.kernels import ops as _fused_ops  # noqa: F401  (defines torch.ops.torchtpu.conv_bn)

aten = torch.ops.aten


def _expand(value, n):
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    return value * n if len(value) == 1 else value


def _dimension_numbers(nd):
    spatial = "DHW"[3 - nd:] if nd <= 3 else None
    if spatial is None:
        raise NotImplementedError(f"{nd}-d convolution")
    return lax.conv_dimension_numbers(
        (1, 1) + (1,) * nd, (1, 1) + (1,) * nd,
        ("NC" + spatial, "OI" + spatial, "NC" + spatial))


def conv(x, w, stride, padding, dilation, transposed, output_padding, groups, platform=None, aten=False):
    """torch's convolution (no bias), computed in x's dtype with float32 accumulation.

    On the CPU, XLA's grouped and depthwise convolutions are slow (measured 3x and 130x
    slower than the forms below, docs/DECISIONS.md), so those take another form there, and so do
    convolutions over disjoint patches (`cuts_patches`: a ViT's patch embedding), a product. With
    `aten` the convolution calls ATen's own kernel (kernels/aten_cpu.py): 2d and 3d ones of any
    groups channels-last, which oneDNN runs fastest (docs/DECISIONS.md 40), 1d dense ones as they are.
    """
    nd = x.ndim - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    output_padding = _expand(output_padding or 0, nd)
    if aten and aten_takes(x, w, transposed, groups):
        return _aten_convolution(x, w, stride, padding, dilation, groups)
    acc = accumulate_dtype(x.dtype)
    integer = not jnp.issubdtype(x.dtype, jnp.inexact)
    kw = {} if integer else dict(precision=precision(), preferred_element_type=acc)
    if platform == "cpu" and not transposed and cuts_patches(w.shape[2:], stride, padding, dilation, groups):
        return _patches_product(x, w, kw)
    dn = _dimension_numbers(nd)
    if platform == "cpu" and not transposed and not integer and groups > 1:
        if groups == x.shape[1] == w.shape[0] and math.prod(w.shape[2:]) <= _MAX_SHIFTED_TAPS:
            return _depthwise_by_shifts(x.astype(acc), w.astype(acc), stride, padding, dilation)
        if groups <= _MAX_SPLIT_GROUPS:
            xs, ws = jnp.split(x, groups, axis=1), jnp.split(w, groups, axis=0)
            return jnp.concatenate([conv(a, b, stride, padding, dilation, False, None, 1, platform, aten)
                                    for a, b in zip(xs, ws)], axis=1)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups, **kw)
    # Transposed: a stride-1 convolution over the input dilated by `stride`, with the
    # kernel flipped and its in/out channels swapped within each group.
    cin, cout_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w = w.reshape((groups, cin // groups, cout_g) + k)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op_)
            for kk, p, d, op_ in zip(k, padding, dilation, output_padding)]
    return lax.conv_general_dilated(
        x, w, window_strides=(1,) * nd, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups, **kw)


_MAX_SHIFTED_TAPS = 64  # kernel elements: one multiply-add each, fused by XLA into one loop
_MAX_SPLIT_GROUPS = 16


def cuts_patches(kernel, stride, padding, dilation, groups) -> bool:
    """Whether a (non-transposed) convolution reads disjoint patches of its input: one group,
    the stride equal to the kernel, no padding, no dilation (arguments expanded per dimension)."""
    return (groups == 1 and list(stride) == list(kernel) and not any(padding)
            and all(d == 1 for d in dilation))


def _patches_product(x, w, kw):
    """A convolution over disjoint patches as one product: the input viewed as
    [N, C, o1, k1, o2, k2, ...] (what no patch covers sliced off), contracted over C and the k's
    with the kernel [O, C, k1, k2, ...]. XLA:CPU's convolution with a 3-channel input is slow,
    and ATen's inside the program pays an OpenMP team (docs/DECISIONS.md 113); its product is
    neither, and its gradients are products too."""
    nd = x.ndim - 2
    kernel = w.shape[2:]
    out = [n // k for n, k in zip(x.shape[2:], kernel)]
    x = x[(slice(None), slice(None)) + tuple(slice(0, o * k) for o, k in zip(out, kernel))]
    x = x.reshape(x.shape[:2] + tuple(itertools.chain.from_iterable(zip(out, kernel))))
    lhs_contract = (1,) + tuple(3 + 2 * i for i in range(nd))
    y = lax.dot_general(x, w, ((lhs_contract, tuple(range(1, nd + 2))), ((), ())), **kw)
    return jnp.moveaxis(y, -1, 1)  # [N, o1, ..., O] -> [N, O, o1, ...]


def _aten_convolution(x, w, stride, padding, dilation, groups, **epilogue):
    """ATen's kernel (kernels/aten_cpu.py) for expanded arguments; `epilogue` is bias/relu."""
    nd = x.ndim - 2
    out = _out_size(x.shape[2:], w.shape[2:], stride, padding, dilation)
    return aten_cpu.convolution(x, w, stride, padding, dilation, groups, [x.shape[0], w.shape[0], *out],
                                channels_last=_channels_last(nd), **epilogue)


def aten_takes(x, w, transposed, groups) -> bool:
    """Whether `conv` hands a convolution that may call ATen (`calls_aten`) to ATen's kernel."""
    return not transposed and (groups == 1 or _channels_last(x.ndim - 2)) and aten_cpu.one_dtype(x, w)


def _channels_last(nd: int) -> bool:
    """ATen runs a 2d/3d convolution channels-last (torch has that memory format for 4d/5d only)."""
    return nd in (2, 3)


def _out_size(spatial, kernel, stride, padding, dilation) -> list[int]:
    """A forward convolution's output spatial sizes."""
    return [(n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, k, s, p, d in zip(spatial, kernel, stride, padding, dilation)]


def _depthwise_by_shifts(x, w, stride, padding, dilation):
    """A depthwise convolution (one filter per channel) as a sum of shifted, strided slices of
    the padded input, each scaled by one kernel tap."""
    nd = x.ndim - 2
    x = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    k = w.shape[2:]
    out_size = _out_size(x.shape[2:], k, stride, [0] * nd, dilation)
    out = None
    for tap in itertools.product(*(range(kk) for kk in k)):
        start = [0, 0] + [t * d for t, d in zip(tap, dilation)]
        limit = list(x.shape[:2]) + [b + s * (o - 1) + 1 for b, s, o in zip(start[2:], stride, out_size)]
        piece = lax.slice(x, start, limit, [1, 1] + list(stride))
        term = piece * w[(slice(None), 0) + tap].reshape((1, -1) + (1,) * nd)
        out = term if out is None else out + term
    return out


def _add_bias(out, bias):
    if bias is None:
        return out
    return out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (out.ndim - 2))


# The gradients of a dense float32 or bfloat16 2d convolution with at least this many input channels
# are XLA's own: inside whole training steps they ran faster than ATen's backward (docs/DECISIONS.md
# 112, 113), which is not split over XLA's pool (its weight gradient sums over the batch) and pays
# an OpenMP team on XLA's thread. Fewer channels give XLA's convolution a contraction too short for
# its kernels (a 3-channel stem: 4x slower than oneDNN). The forward is ATen's at any width: split
# over XLA's pool in blocks of the batch (DECISIONS 121) it beats XLA's at two or more threads, and
# matches it at one (DECISIONS 123).
XLA_DENSE_MIN_CHANNELS = 32


def calls_aten(ctx, x, w, stride, padding, dilation, groups, backward: bool = False) -> bool:
    """Whether this convolution calls ATen's kernel on this target: in its forward, or with
    `backward` in its gradients (`convolution_backward`)."""
    nd = x.ndim - 2
    xla_is_faster = (backward and groups == 1 and x.ndim == 4 and x.dtype in (jnp.float32, jnp.bfloat16)
                     and x.shape[1] >= XLA_DENSE_MIN_CHANNELS)
    patches = cuts_patches(w.shape[2:], _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd), groups)
    return use_aten(ctx) and not xla_is_faster and not patches


def writes_channels_minor(node, ctx) -> bool:
    """Whether an FX convolution (`aten.convolution`, or `convolution_backward` for its input
    gradient) runs as ATen's channels-last kernel here, so that XLA keeps its result
    channels-minor in memory (decision 40)."""
    if node.target is aten.convolution_backward.default:
        _, x, w, _, stride, padding, dilation, transposed, _, groups, _ = node.args
    elif node.target in (aten.convolution.default, aten._convolution.default):
        x, w, _, stride, padding, dilation, transposed, _, groups = node.args[:9]
    else:
        return False
    vals = [getattr(v, "meta", {}).get("val") for v in (x, w)]
    if not all(isinstance(v, torch.Tensor) and all(type(d) is int for d in v.shape) for v in vals):
        return False  # no metadata, or a symbolic size (reading it would add a guard)
    x, w = (jax.ShapeDtypeStruct(tuple(v.shape), dtypes.to_jax(v.dtype)) for v in vals)
    return (_channels_last(x.ndim - 2) and aten_takes(x, w, transposed, groups)
            and calls_aten(ctx, x, w, stride, padding, dilation, groups,
                           backward=node.target is aten.convolution_backward.default))


def use_aten(ctx) -> bool:
    """ATen's CPU kernels for this program: the CPU target, not partitioned, not turned off."""
    return (ctx.platform == "cpu" and ctx.options.aten_kernels == "auto" and ctx.options.mesh is None
            and aten_cpu.available())


@op(aten.convolution.default)
def _convolution(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _add_bias(conv(x, w, stride, padding, dilation, transposed, output_padding, groups, ctx.platform,
                          calls_aten(ctx, x, w, stride, padding, dilation, groups)), bias)


@op(aten._convolution.default)
def _convolution_full(ctx, x, w, bias, stride, padding, dilation, transposed, output_padding, groups,
                      benchmark=False, deterministic=False, cudnn_enabled=True, allow_tf32=True):
    return _add_bias(conv(x, w, stride, padding, dilation, transposed, output_padding, groups, ctx.platform,
                          calls_aten(ctx, x, w, stride, padding, dilation, groups)), bias)


@op(aten.convolution_backward.default)
def _convolution_backward(ctx, grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    acc = accumulate_dtype(grad.dtype)
    grad_input = grad_weight = grad_bias = None
    nd = x.ndim - 2
    if ((output_mask[0] or output_mask[1]) and not transposed and aten_cpu.one_dtype(grad, x, w)
            and calls_aten(ctx, x, w, stride, padding, dilation, groups, backward=True)):
        grad_input, grad_weight = aten_cpu.convolution_backward(
            grad, x, w, _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd), groups, output_mask[:2],
            channels_last=_channels_last(nd))
    elif output_mask[0] or output_mask[1]:
        def forward(x_, w_):
            return conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups,
                        ctx.platform).astype(acc)

        _, vjp = jax.vjp(forward, x.astype(acc) if acc != x.dtype else x, w.astype(acc) if acc != w.dtype else w)
        grad_input, grad_weight = vjp(grad.astype(acc))
        grad_input = grad_input if output_mask[0] else None
        grad_weight = grad_weight if output_mask[1] else None
    if output_mask[2]:
        grad_bias = sum_(grad.astype(acc), (0,) + tuple(range(2, grad.ndim)), ctx=ctx, source=ctx.node.args[0])
    return grad_input, grad_weight, grad_bias


@op(torch.ops.torchtpu.conv_bn.default)
def _conv_bn(ctx, x, w, b, bn_weight, bn_bias, mean, var, eps, stride, padding, dilation, groups, relu):
    """passes/conv_bn.py's fused node. On the CPU with ATen's kernels (float32 2d), the
    normalisation is folded into the weights and bias, y = conv(x, w * s) + (b - mean) * s + beta
    with s = gamma / sqrt(var + eps), and oneDNN adds the bias and applies ReLU as it writes the
    result (docs/DECISIONS.md 44); elsewhere the three ops as their own rules lower them."""
    nd = x.ndim - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    params = [p for p in (b, bn_weight, bn_bias, mean, var) if p is not None]
    if (calls_aten(ctx, x, w, stride, padding, dilation, groups) and aten_cpu.writes_into(x, w, _channels_last(nd))
            and all(p.dtype == jnp.float32 for p in params)):
        s = lax.rsqrt(var + eps) * (bn_weight if bn_weight is not None else 1.0)
        folded_w = w * s.reshape((-1,) + (1,) * (w.ndim - 1))
        folded_b = ((b if b is not None else 0.0) - mean) * s + (bn_bias if bn_bias is not None else 0.0)
        return _aten_convolution(x, folded_w, stride, padding, dilation, groups, bias=folded_b, relu=relu)
    y = _add_bias(conv(x, w, stride, padding, dilation, False, None, groups, ctx.platform,
                       calls_aten(ctx, x, w, stride, padding, dilation, groups)), b)
    y = _batch_norm_eval(y, bn_weight, bn_bias, mean, var, eps)
    return jnp.maximum(y, jnp.zeros((), y.dtype)) if relu else y
