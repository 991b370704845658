"""Scaled dot-product attention in the fused forms AOTAutograd leaves in graphs on CPU
(`_scaled_dot_product_flash_attention_for_cpu` and its backward).

Per node, `kernels.choose` picks JAX's TPU flash attention (Mosaic on a TPU target, or
interpret mode) or XLA's own ops. On the CPU the forward is torch's own kernel as a custom call
(kernels/aten_cpu.py; decision 120). The XLA backward is torch's from the saved output and
logsumexp, on the CPU torch's own kernel where it pays (decision 113); the kernel
backward is the kernel's own backward half fed with the forward's logsumexp. Forward and
backward of one graph pair always choose alike: the choice depends only on the options, the
target and the arguments, which both nodes share."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from torchtpu import kernels
from torchtpu.compiler.registry import op
from torchtpu.compiler.rules.conv import use_aten
from torchtpu.compiler.rules.reduction import accumulate_dtype
from torchtpu.kernels import aten_cpu, attention as flash

aten = torch.ops.aten


_HIGHEST = jax.lax.Precision.HIGHEST


def _heads_like(q, kv):
    """Grouped-query attention: each kv head repeated for its group of q heads."""
    rep = q.shape[-3] // kv.shape[-3]
    return kv if rep == 1 else jnp.repeat(kv, rep, axis=-3)


def _scale(q, scale):
    """The scores' scale: the given one, else torch's 1/sqrt(head width)."""
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _scores(q, k, mask, causal, scale):
    """q k^T * scale, with the causal and the given mask applied (masked: -inf)."""
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=_HIGHEST) * _scale(q, scale)
    if causal:
        lq, lk = scores.shape[-2], scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((lq, lk), jnp.bool_)), scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == jnp.bool_ else scores + mask.astype(scores.dtype)
    return scores


def _unnormalized_softmax(scores):
    """(row max, exp(scores - max), row sum): a fully masked row's max is clamped to the dtype's
    lowest finite value, so its exps and sum are 0 rather than NaN."""
    top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), jnp.finfo(scores.dtype).min)
    weights = jnp.exp(scores - top)
    return top, weights, jnp.sum(weights, axis=-1, keepdims=True)


def attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T * scale + mask) v, with GQA head broadcasting; returns (out, logsumexp).

    The softmax's division is applied to the output (rows of v's width) rather than to the
    probabilities (rows of the key length), and a fully masked row's max is clamped to the
    dtype's lowest finite value rather than replaced through an isfinite test: both the same
    numbers (a fully masked row gives zeros and a logsumexp of 0, as torch's kernel), and
    XLA:CPU fuses this form far better: the diffusers UNet's self-attention (8 heads of 4, 256
    tokens, batch 8) went from 22 to 3.9 ms when the logsumexp is not used, 22 to 17 when it is.
    """
    acc = accumulate_dtype(q.dtype)
    q, k, v = q.astype(acc), _heads_like(q, k.astype(acc)), _heads_like(q, v.astype(acc))
    top, weights, total = _unnormalized_softmax(_scores(q, k, mask, causal, scale))
    out = jnp.einsum("...qk,...kd->...qd", weights, v, precision=_HIGHEST)
    empty = total == 0  # a fully masked row: output 0 (not 0 / 0) and logsumexp 0, as torch's kernel
    out = out / jnp.where(empty, 1.0, total)
    return out, jnp.where(empty, 0.0, top + jnp.log(total))[..., 0]


def attention_backward(grad_out, q, k, v, out, logsumexp, mask=None, causal=False, scale=None,
                       renormalize=False):
    """(dq, dk, dv) of `attention` from its saved output and logsumexp, as torch's CPU kernel
    computes them: P = exp(S - lse) recomputed once, dS = P * (dO V^T - rowsum(dO * O)).

    Not the VJP of `attention`: that one recomputes the softmax and also differentiates its max
    (a [.., q, k] compare and select whose gradient is zero), three passes over the scores more
    (the UNet's 256-token self-attention backward: docs/DECISIONS.md 96).

    renormalize: P = exp(S - rowmax) / rowsum instead, the saved logsumexp unused (two passes
    over the scores more). Where log and exp are not correctly rounded (a TPU's float32), P from
    the logsumexp is off by its error in every entry, and dS, a difference of near-equal terms,
    multiplies it: on a v5e dq/dk/dv were 2.8e-5 off float64 that way, 1.1e-6 renormalized
    (the CPU: 3e-7 either way; docs/DECISIONS.md 129)."""
    acc = accumulate_dtype(q.dtype)
    q, grad_out, out = q.astype(acc), grad_out.astype(acc), out.astype(acc)
    kr, vr = _heads_like(q, k.astype(acc)), _heads_like(q, v.astype(acc))
    scores = _scores(q, kr, mask, causal, scale)
    if renormalize:
        _, weights, total = _unnormalized_softmax(scores)
        probs = weights / jnp.where(total == 0, 1.0, total)  # a fully masked row: probabilities 0
    else:
        # a fully masked row's scores are all -inf and its logsumexp 0: its probabilities are 0
        probs = jnp.exp(scores - logsumexp.astype(acc)[..., None])
    dv = jnp.einsum("...qk,...qd->...kd", probs, grad_out, precision=_HIGHEST)
    dp = jnp.einsum("...qd,...kd->...qk", grad_out, vr, precision=_HIGHEST)
    ds = probs * (dp - jnp.sum(grad_out * out, axis=-1, keepdims=True))
    scale = _scale(q, scale)
    dq = jnp.einsum("...qk,...kd->...qd", ds, kr, precision=_HIGHEST) * scale
    dk = jnp.einsum("...qk,...qd->...kd", ds, q, precision=_HIGHEST) * scale
    return dq, _group_sum(dk, k), _group_sum(dv, v)


def _group_sum(grad, kv):
    """Grouped-query attention: each kv head's gradient is the sum over its group of q heads."""
    if grad.shape[-3] == kv.shape[-3]:
        return grad
    group = (*kv.shape[:-3], kv.shape[-3], grad.shape[-3] // kv.shape[-3], *grad.shape[-2:])
    return grad.reshape(group).sum(axis=-3)


# On the CPU, torch's attention backward kernel runs inside the program only where XLA's ops are far
# behind: heads narrower than this (XLA's products contract too few elements), or more scores per
# head than this (XLA writes them all; torch's kernel works block by block). Elsewhere XLA's ops
# were faster in the training step at default threads: the kernel's OpenMP team on XLA's threads
# costs more than it gains (docs/DECISIONS.md 113).
XLA_BACKWARD_MIN_HEAD_DIM = 16
XLA_BACKWARD_MAX_SCORES = 128 * 128


def aten_backward_pays(q, k) -> bool:
    """Whether this attention's backward calls torch's kernel, where ATen's kernels are on."""
    return q.shape[-1] < XLA_BACKWARD_MIN_HEAD_DIM or q.shape[-2] * k.shape[-2] > XLA_BACKWARD_MAX_SCORES


def _flash_choice(ctx, q, k, v, attn_mask, dropout_p) -> str:
    """The flash kernel's choice for this attention (float32 only where its matmuls may be bfloat16)."""
    return kernels.choose(ctx, "flash_attention", flash.supports(q, k, v, attn_mask, dropout_p),
                          mosaic_why_not=kernels.precision_gap(q.dtype))


@op(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("dropout inside fused attention; use the math path (dropout_p=0)")
    choice = _flash_choice(ctx, q, k, v, attn_mask, dropout_p)
    if choice != kernels.XLA:
        with kernels.running(choice):
            return flash.flash_fwd(q, k, v, attn_mask, is_causal, scale)
    if use_aten(ctx) and aten_cpu.attention_supports(q, k, v, attn_mask):
        return aten_cpu.attention(q, _heads_like(q, k), _heads_like(q, v), attn_mask, is_causal, scale)
    out, lse = attention(q, k, v, attn_mask, is_causal, scale)
    return out.astype(q.dtype), lse


@op(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_flash_cpu_backward(ctx, grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
                             attn_mask=None, scale=None):
    choice = _flash_choice(ctx, q, k, v, attn_mask, dropout_p)
    if choice != kernels.XLA:
        with kernels.running(choice):
            return flash.flash_bwd(grad_out, q, k, v, out, logsumexp, attn_mask, is_causal, scale)
    if (use_aten(ctx) and aten_backward_pays(q, k)
            and aten_cpu.attention_supports(q, k, v, attn_mask, grad_out, out)):
        dq, dk, dv = aten_cpu.attention_backward(grad_out, q, _heads_like(q, k), _heads_like(q, v), out, logsumexp,
                                                 attn_mask, is_causal, scale)
        return dq, _group_sum(dk, k), _group_sum(dv, v)
    # a TPU's float32 exp and log are not accurate enough for the saved logsumexp (measured on a v5e);
    # the CPU's are, and there the logsumexp form is faster; a GPU's were not measured: as the CPU
    return attention_backward(grad_out, q, k, v, out, logsumexp, attn_mask, is_causal, scale,
                              renormalize=ctx.platform == "tpu")
