"""Adapters from torch's SDPA semantics to JAX's shipped TPU flash attention
(`jax.experimental.pallas.ops.tpu.flash_attention`).

The kernel wants [B, H, L, D] with equal head counts, sequence lengths that are multiples of
its blocks, and an additive bias that it adds *before* scaling. The adapters:
- GQA: kv heads are repeated to q's head count (and their gradients summed back);
- masks: a boolean mask becomes a large negative bias, an additive mask is divided by the
  scale (so bias * scale is torch's mask), both broadcast to [B, H, Lq, Lk] in float32;
- lengths: q and kv are zero-padded to a multiple of 128; padded keys are masked with
  segment ids (real keys 1, padded keys 0; every query is 1), padded queries are sliced away.

AOTAutograd hands forward and backward to us as separate programs, so the backward cannot
re-enter the forward's custom_vjp. `flash_fwd` therefore returns torch's logsumexp and
`flash_bwd` calls the kernel's own backward half with residuals rebuilt from it (the kernel
stores per-row max m and sum l; p = exp(s - m) / l is exp(s - lse) for m = lse, l = 1).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as fa

BLOCK = fa.MIN_BLOCK_SIZE  # 128: the kernel's lane width; blocks are multiples of it
MASKED = -1e30  # finite: a fully masked (padded) row stays NaN-free inside the kernel


def supports(q, k, v, mask, dropout_p) -> str | None:
    """Why the flash kernel cannot run this attention (None: it can)."""
    if dropout_p:
        return "dropout"
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return f"rank {q.ndim} (the kernel takes [B, H, L, D])"
    if q.dtype not in (jnp.float32, jnp.bfloat16):
        return f"dtype {q.dtype}"
    if v.shape[-1] != q.shape[-1]:
        return "v's head size differs from q's"
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} kv heads"
    if mask is not None and mask.ndim > 4:
        return f"mask of rank {mask.ndim}"
    return None


def _blocks(lq: int, lk: int) -> fa.BlockSizes:
    def pick(n):
        return next(b for b in (512, 256, BLOCK) if n % b == 0)

    bq, bk = pick(lq), pick(lk)
    return fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
                         block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
                         block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)


def _round(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _pad(x, axis, size, value=0.0):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value) if size != x.shape[axis] else x


class _Plan:
    """The padded operands the kernel sees for one attention call."""

    def __init__(self, q, k, v, mask, scale):
        b, h, lq, d = q.shape
        self.shape, self.kv_heads, self.rep = q.shape, k.shape[1], h // k.shape[1]
        self.lk = k.shape[2]
        self.lq_pad, self.lk_pad = _round(lq), _round(self.lk)
        self.scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        self.blocks = _blocks(self.lq_pad, self.lk_pad)
        self.q = _pad(q, 2, self.lq_pad)
        self.k = _pad(self._heads(k), 2, self.lk_pad)
        self.v = _pad(self._heads(v), 2, self.lk_pad)
        self.ab = self._bias(mask, (b, h, lq, self.lk))
        self.segments = None
        if self.lk_pad != self.lk:
            kv = (jnp.arange(self.lk_pad) < self.lk).astype(jnp.int32)
            self.segments = fa.SegmentIds(q=jnp.ones((b, self.lq_pad), jnp.int32),
                                          kv=jnp.broadcast_to(kv, (b, self.lk_pad)))

    def _heads(self, x):
        return jnp.repeat(x, self.rep, axis=1) if self.rep > 1 else x

    def _bias(self, mask, shape):
        if mask is None:
            return None
        if mask.dtype == jnp.bool_:
            bias = jnp.where(mask, 0.0, MASKED)
        else:
            bias = jnp.maximum(mask.astype(jnp.float32) / self.scale, MASKED)
        bias = jnp.broadcast_to(bias, shape).astype(jnp.float32)
        return _pad(_pad(bias, 2, self.lq_pad), 3, self.lk_pad)

    def unpad_q(self, x):
        return x[:, :, : self.shape[2]]

    def kv_grad(self, x):
        x = x[:, :, : self.lk]
        if self.rep > 1:
            b, _, l, d = x.shape
            x = x.reshape(b, self.kv_heads, self.rep, l, d).sum(axis=2)
        return x


def flash_fwd(q, k, v, mask=None, causal=False, scale=None):
    """Attention through the TPU flash kernel: (out [B, H, Lq, D] in q's dtype, logsumexp f32 [B, H, Lq])."""
    p = _Plan(q, k, v, mask, scale)
    out, l, m = fa._flash_attention(p.q, p.k, p.v, p.ab, p.segments, True, bool(causal), p.scale,
                                    p.blocks, False)
    lse = m + jnp.log(l)
    return p.unpad_q(out).astype(q.dtype), p.unpad_q(lse)


def flash_bwd(grad_out, q, k, v, out, lse, mask=None, causal=False, scale=None):
    """(dq, dk, dv) of flash_fwd, from its output and logsumexp (no forward recomputation)."""
    p = _Plan(q, k, v, mask, scale)
    out = _pad(out.astype(q.dtype), 2, p.lq_pad)
    do = _pad(grad_out.astype(q.dtype), 2, p.lq_pad)
    m = _pad(lse.astype(jnp.float32), 2, p.lq_pad)
    residuals = (p.q, p.k, p.v, p.ab, p.segments, out, jnp.ones_like(m), m)
    dq, dk, dv, _, _ = fa._flash_attention_bwd(False, bool(causal), p.scale, p.blocks, False, residuals, do)
    return p.unpad_q(dq), p.kv_grad(dk), p.kv_grad(dv)
