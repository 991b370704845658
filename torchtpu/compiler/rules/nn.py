"""Normalisation, embedding and loss-adjacent ops. Backward rules are the VJPs of the
forward rules, so the two can never disagree."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
import torch

from torchtpu import kernels
from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.reduction import accumulate_dtype, sum_
from torchtpu.kernels import norms
from torchtpu.kernels import ops as _fused_ops  # noqa: F401  (defines torch.ops.torchtpu.rms_norm)

aten = torch.ops.aten


# --- layer norm ------------------------------------------------------------------------------


def _layer_norm(x, normalized_shape, weight, bias, eps):
    acc = accumulate_dtype(x.dtype)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(acc)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight.astype(acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return out.astype(x.dtype), mean, rstd


def _norm_kernel(ctx, name, x):
    why_not = None if x.dtype in (jnp.float32, jnp.bfloat16) and x.size else f"dtype {x.dtype} / empty"
    return kernels.choose(ctx, name, why_not)


def _stat_shape(x, normalized_shape):
    return x.shape[: x.ndim - len(normalized_shape)] + (1,) * len(normalized_shape)


@op(aten.native_layer_norm.default)
def _native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    choice = _norm_kernel(ctx, "layer_norm", x)
    if choice != kernels.XLA:
        d = math.prod(normalized_shape)
        with kernels.running(choice):
            y, mean, rstd = norms.norm_fwd(x, weight, bias, eps, d=d, rms=False,
                                           interpret=choice == kernels.INTERPRET)
        shape = _stat_shape(x, normalized_shape)
        return y, mean.reshape(shape), rstd.reshape(shape)
    return _layer_norm(x, list(normalized_shape), weight, bias, eps)


@op(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(ctx, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    choice = _norm_kernel(ctx, "layer_norm", x)
    if choice != kernels.XLA:
        with kernels.running(choice):
            dx, dw, db = norms.norm_bwd(grad, x, weight, mean, rstd, d=math.prod(normalized_shape), rms=False,
                                        interpret=choice == kernels.INTERPRET)
        return ((dx if output_mask[0] else None),
                (dw.reshape(weight.shape) if weight is not None and output_mask[1] else None),
                (db.reshape(bias.shape) if bias is not None and output_mask[2] else None))
    acc = accumulate_dtype(x.dtype)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xhat = (x.astype(acc) - mean) * rstd
    g = grad.astype(acc)
    gw = g * weight.astype(acc) if weight is not None else g
    n = math.prod(x.shape[a] for a in axes)
    dx = rstd / n * (n * gw - jnp.sum(gw, axis=axes, keepdims=True)
                     - xhat * jnp.sum(gw * xhat, axis=axes, keepdims=True))
    lead = tuple(range(x.ndim - len(normalized_shape)))
    dweight = jnp.sum(g * xhat, axis=lead) if weight is not None and output_mask[1] else None
    dbias = jnp.sum(g, axis=lead) if bias is not None and output_mask[2] else None
    return (dx if output_mask[0] else None), dweight, dbias


@op(torch.ops.torchtpu.rms_norm.default)
def _rms_norm(ctx, x, weight, eps):
    """The fused RMSNorm node of passes/pallas_rewrites.py: (y, rstd)."""
    choice = _norm_kernel(ctx, "rms_norm", x)
    if choice != kernels.XLA:
        with kernels.running(choice):
            y, _, rstd = norms.norm_fwd(x, weight, None, eps, d=x.shape[-1], rms=True,
                                        interpret=choice == kernels.INTERPRET)
        return y, rstd.reshape(x.shape[:-1] + (1,))
    acc = accumulate_dtype(x.dtype)
    xf = x.astype(acc)
    rstd = lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    y = xf * rstd
    if weight is not None:
        y = y.astype(weight.dtype).astype(acc) * weight.astype(acc)
    return y, rstd


# --- batch norm ------------------------------------------------------------------------------


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _channel_sum(v, ctx):
    """Per-channel sum of v, an array computed from the rule's first argument (`sum_`)."""
    return sum_(v, tuple(i for i in range(v.ndim) if i != 1), ctx=ctx, source=ctx and ctx.node.args[0])


def _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, ctx=None):
    acc = accumulate_dtype(x.dtype)
    xf = x.astype(acc)
    n = x.size // x.shape[1]
    mean = _channel_sum(xf, ctx) / n
    var = _channel_sum(jnp.square(xf - mean.reshape(_bn_shape(x))), ctx) / n
    invstd = lax.rsqrt(var + eps)
    out = (xf - mean.reshape(_bn_shape(x))) * invstd.reshape(_bn_shape(x))
    if weight is not None:
        out = out * weight.astype(acc).reshape(_bn_shape(x))
    if bias is not None:
        out = out + bias.astype(acc).reshape(_bn_shape(x))
    new_rm = new_rv = None
    if running_mean is not None:
        unbiased = var * (n / max(n - 1, 1))
        new_rm = (1 - momentum) * running_mean + momentum * mean.astype(running_mean.dtype)
        new_rv = (1 - momentum) * running_var + momentum * unbiased.astype(running_var.dtype)
    return out.astype(x.dtype), mean, invstd, new_rm, new_rv


def _batch_norm_eval(x, weight, bias, running_mean, running_var, eps):
    acc = accumulate_dtype(x.dtype)
    invstd = lax.rsqrt(running_var.astype(acc) + eps)
    out = (x.astype(acc) - running_mean.astype(acc).reshape(_bn_shape(x))) * invstd.reshape(_bn_shape(x))
    if weight is not None:
        out = out * weight.astype(acc).reshape(_bn_shape(x))
    if bias is not None:
        out = out + bias.astype(acc).reshape(_bn_shape(x))
    return out.astype(x.dtype)


def _empty_stats(x):
    return jnp.zeros((0,), accumulate_dtype(x.dtype))


@op(aten._native_batch_norm_legit_functional.default)
def _bn_legit_functional(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out = _batch_norm_eval(x, weight, bias, running_mean, running_var, eps)
        return out, _empty_stats(x), _empty_stats(x), running_mean, running_var
    out, mean, invstd, rm, rv = _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, ctx)
    return out, mean, invstd, rm, rv


@op(aten._native_batch_norm_legit.default, aten.native_batch_norm.default)
def _bn_legit(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    # Only reached without functionalization; running stats are not written back here.
    if not training:
        return _batch_norm_eval(x, weight, bias, running_mean, running_var, eps), _empty_stats(x), _empty_stats(x)
    out, mean, invstd, _, _ = _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps, ctx)
    return out, mean, invstd


@op(aten._native_batch_norm_legit.no_stats)
def _bn_legit_no_stats(ctx, x, weight, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _batch_norm_train(x, weight, bias, None, None, momentum, eps, ctx)
    return out, mean, invstd


@op(aten._native_batch_norm_legit_no_training.default)
def _bn_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm_eval(x, weight, bias, running_mean, running_var, eps), _empty_stats(x), _empty_stats(x)


@op(aten.native_batch_norm_backward.default)
def _native_batch_norm_backward(ctx, grad, x, weight, running_mean, running_var, save_mean, save_invstd,
                                train, eps, output_mask):
    acc = accumulate_dtype(x.dtype)
    shape = _bn_shape(x)
    if train:
        mean, invstd = save_mean.astype(acc), save_invstd.astype(acc)
    else:
        mean, invstd = running_mean.astype(acc), lax.rsqrt(running_var.astype(acc) + eps)
    g = grad.astype(acc)
    xhat = (x.astype(acc) - mean.reshape(shape)) * invstd.reshape(shape)
    w = weight.astype(acc) if weight is not None else jnp.ones_like(mean)
    n = x.size // x.shape[1]
    sum_g = _channel_sum(g, ctx)
    sum_gx = _channel_sum(g * xhat, ctx)
    if train:
        dx = (w * invstd).reshape(shape) * (g - (sum_g / n).reshape(shape) - xhat * (sum_gx / n).reshape(shape))
    else:
        dx = g * (w * invstd).reshape(shape)
    return (dx if output_mask[0] else None), (sum_gx if output_mask[1] else None), (sum_g if output_mask[2] else None)


# --- group norm ------------------------------------------------------------------------------


def _group_norm(x, weight, bias, n, c, hw, group, eps):
    acc = accumulate_dtype(x.dtype)
    xg = x.astype(acc).reshape(n, group, -1)
    mean = jnp.mean(xg, axis=-1)
    var = jnp.mean(jnp.square(xg - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.astype(acc).reshape(shape)
    if bias is not None:
        out = out + bias.astype(acc).reshape(shape)
    return out.astype(x.dtype), mean, rstd


@op(aten.native_group_norm.default)
def _native_group_norm(ctx, x, weight, bias, n, c, hw, group, eps):
    return _group_norm(x, weight, bias, n, c, hw, group, eps)


@op(aten.native_group_norm_backward.default)
def _native_group_norm_backward(ctx, grad, x, mean, rstd, weight, n, c, hw, group, output_mask):
    acc = accumulate_dtype(x.dtype)
    shape = (1, c) + (1,) * (x.ndim - 2)
    g = grad.astype(acc)
    w = weight.astype(acc).reshape(shape) if weight is not None else jnp.ones(shape, acc)
    xg = x.astype(acc).reshape(n, group, -1)
    xhat = (xg - mean[..., None]) * rstd[..., None]
    gw = (g * w).reshape(n, group, -1)
    dx = rstd[..., None] * (gw - jnp.mean(gw, axis=-1, keepdims=True)
                            - xhat * jnp.mean(gw * xhat, axis=-1, keepdims=True))
    reduce_axes = tuple(i for i in range(x.ndim) if i != 1)
    dw = jnp.sum(g * xhat.reshape(x.shape), axis=reduce_axes)
    db = jnp.sum(g, axis=reduce_axes)
    return ((dx.reshape(x.shape) if output_mask[0] else None),
            (dw if output_mask[1] and weight is not None else None),
            (db if output_mask[2] else None))


@op(aten._weight_norm_interface_backward.default)
def _weight_norm_interface_backward(ctx, grad_w, v, g, norms, dim):
    """(dv, dg) of w = v * g / ||v||, the norm over every dim but `dim` (the forward decomposes)."""
    acc = accumulate_dtype(v.dtype)
    grad_w, v, g, norms = (x.astype(acc) for x in (grad_w, v, g, norms))
    axes = tuple(i for i in range(v.ndim) if i != dim)
    grad_g = jnp.sum(grad_w * v, axis=axes, keepdims=True) / norms
    return g / norms * (grad_w - v * (grad_g / norms)), grad_g


# --- embedding -------------------------------------------------------------------------------


@op(aten.embedding.default)
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@op(aten.embedding_dense_backward.default)
def _embedding_dense_backward(ctx, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    acc = accumulate_dtype(grad.dtype)
    flat_idx = indices.reshape(-1)
    flat_grad = grad.reshape(flat_idx.shape[0], -1).astype(acc)
    if padding_idx >= 0:
        flat_grad = jnp.where((flat_idx == padding_idx)[:, None], 0, flat_grad)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), acc).at[flat_idx].add(1)
        flat_grad = flat_grad / counts[flat_idx][:, None]
    return jnp.zeros((num_weights, flat_grad.shape[1]), acc).at[flat_idx].add(flat_grad)


# --- activations' backward -------------------------------------------------------------------


@op(aten.threshold_backward.default)
def _threshold_backward(ctx, grad, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@op(aten.hardshrink_backward.default, aten.softshrink_backward.default)  # one formula
def _shrink_backward(ctx, grad, x, lambd):
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros((), grad.dtype), grad)


@op(aten.sigmoid_backward.default)
def _sigmoid_backward(ctx, grad, out):
    return grad * out * (1 - out)


@op(aten.tanh_backward.default)
def _tanh_backward(ctx, grad, out):
    return grad * (1 - out * out)


@op(aten.silu.default)
def _silu(ctx, x):
    acc = accumulate_dtype(x.dtype)
    return jax.nn.silu(x.astype(acc))


@op(aten.silu_backward.default)
def _silu_backward(ctx, grad, x):
    acc = accumulate_dtype(x.dtype)
    x, grad = x.astype(acc), grad.astype(acc)
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@op(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """mode 0 = sum, 1 = mean, 2 = max; returns (output, offset2bag, bag_size, max_indices)."""
    acc = accumulate_dtype(weight.dtype)
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    positions = jnp.arange(n)
    # bag of each index: the number of offsets <= its position, minus one
    offset2bag = jnp.clip(jnp.searchsorted(offsets[:bags], positions, side="right") - 1, 0, max(bags - 1, 0))
    keep = indices != padding_idx if padding_idx >= 0 else jnp.ones((n,), jnp.bool_)
    rows = jnp.take(weight, indices, axis=0).astype(acc)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(acc)[:, None]
    counts = jnp.zeros((bags,), jnp.int64).at[offset2bag].add(keep.astype(jnp.int64))
    if mode == 2:
        masked = jnp.where(keep[:, None], rows, -jnp.inf)
        out = jnp.full((bags, weight.shape[1]), -jnp.inf, acc).at[offset2bag].max(masked)
        out = jnp.where(counts[:, None] > 0, out, 0)
        is_max = (masked == out[offset2bag]) & keep[:, None]
        cand = jnp.where(is_max, indices[:, None], jnp.iinfo(jnp.int64).max)
        max_idx = jnp.full((bags, weight.shape[1]), jnp.iinfo(jnp.int64).max, jnp.int64).at[offset2bag].min(cand)
        max_idx = jnp.where(counts[:, None] > 0, max_idx, -1 if padding_idx >= 0 else 0)
    else:
        out = jnp.zeros((bags, weight.shape[1]), acc).at[offset2bag].add(jnp.where(keep[:, None], rows, 0))
        if mode == 1:
            out = out / jnp.maximum(counts, 1).astype(acc)[:, None]
        max_idx = jnp.zeros((bags,), jnp.int64)
    outs = (out.astype(weight.dtype), offset2bag.astype(jnp.int64), counts, max_idx)
    # torch leaves some of these empty depending on the mode; follow its shapes
    return tuple(o if tuple(o.shape) == tuple(v.shape) else jnp.zeros(tuple(v.shape), o.dtype)
                 for o, v in zip(outs, ctx.val))
