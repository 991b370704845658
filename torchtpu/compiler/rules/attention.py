"""Scaled dot-product attention in the fused forms AOTAutograd leaves in graphs on CPU
(`_scaled_dot_product_flash_attention_for_cpu` and its backward).

Per node, `kernels.choose` picks JAX's TPU flash attention (Mosaic on a TPU target, or
interpret mode) or XLA's own ops. The XLA backward is the VJP of the same math; the kernel
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
from torchtpu.kernels import attention as flash
from torchtpu.compiler.rules.reduction import accumulate_dtype

aten = torch.ops.aten


def attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T * scale + mask) v, with GQA head broadcasting; returns (out, logsumexp).

    The softmax's division is applied to the output (rows of v's width) rather than to the
    probabilities (rows of the key length), and a fully masked row's max is clamped to the
    dtype's lowest finite value rather than replaced through an isfinite test: both the same
    numbers (a fully masked row gives zeros and a logsumexp of -inf, as torch's kernel), and
    XLA:CPU fuses this form far better: the diffusers UNet's self-attention (8 heads of 4, 256
    tokens, batch 8) went from 22 to 3.9 ms when the logsumexp is not used, 22 to 17 when it is.
    """
    acc = accumulate_dtype(q.dtype)
    q, k, v = q.astype(acc), k.astype(acc), v.astype(acc)
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: repeat kv heads
        rep = q.shape[-3] // k.shape[-3]
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...qd,...kd->...qk", q, k, precision=jax.lax.Precision.HIGHEST) * scale
    if causal:
        lq, lk = scores.shape[-2], scores.shape[-1]
        keep = jnp.tril(jnp.ones((lq, lk), jnp.bool_))
        scores = jnp.where(keep, scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == jnp.bool_ else scores + mask.astype(acc)
    top = jnp.maximum(jnp.max(scores, axis=-1, keepdims=True), jnp.finfo(acc).min)  # -inf rows: exp gives 0
    weights = jnp.exp(scores - top)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.einsum("...qk,...kd->...qd", weights, v, precision=jax.lax.Precision.HIGHEST)
    out = out / jnp.where(total == 0, 1.0, total)  # a fully masked row: 0, not 0 / 0
    return out, (top + jnp.log(total))[..., 0]


def _flash_choice(ctx, q, k, v, attn_mask, dropout_p) -> str:
    """The flash kernel's choice for this attention (float32 only where its matmuls may be bfloat16)."""
    return kernels.choose(ctx, "flash_attention", flash.supports(q, k, v, attn_mask, dropout_p),
                          mosaic_why_not=flash.precision_gap(q.dtype))


@op(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if dropout_p:
        raise NotImplementedError("dropout inside fused attention; use the math path (dropout_p=0)")
    choice = _flash_choice(ctx, q, k, v, attn_mask, dropout_p)
    if choice != kernels.XLA:
        with kernels.running(choice):
            return flash.flash_fwd(q, k, v, attn_mask, is_causal, scale)
    out, lse = attention(q, k, v, attn_mask, is_causal, scale)
    return out.astype(q.dtype), lse


@op(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_flash_cpu_backward(ctx, grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *,
                             attn_mask=None, scale=None):
    choice = _flash_choice(ctx, q, k, v, attn_mask, dropout_p)
    if choice != kernels.XLA:
        with kernels.running(choice):
            return flash.flash_bwd(grad_out, q, k, v, out, logsumexp, attn_mask, is_causal, scale)
    acc = accumulate_dtype(q.dtype)

    def f(q, k, v):
        return attention(q, k, v, attn_mask, is_causal, scale)[0]

    _, vjp = jax.vjp(f, q.astype(acc), k.astype(acc), v.astype(acc))
    return vjp(grad_out.astype(acc))
