"""scaled_dot_product_attention on tpu tensors as one fused op each way (device/native.cc
chooses this kernel where it computes what torch's math path would).

torch calls `_scaled_dot_product_fused_attention_overrideable` (and, through its autograd
formula, the `_backward`); both run the fused attention ops the compiler already lowers
(`_scaled_dot_product_flash_attention_for_cpu` and its backward: compiler/rules/attention.py),
as one program in strict mode or one recorded step in defer mode. The outputs torch's CUDA
kernels use for variable-length batches and dropout (cumulative lengths, the philox seed and
offset, the debug mask) are undefined or empty: native.cc never chooses this kernel with
dropout.
"""
from __future__ import annotations

import torch

from torchtpu.device import storage

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def forward(run, query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
            scale=None):
    out, logsumexp = run(FORWARD, query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    seed, offset = storage.empty([], dtype=torch.int64), storage.empty([], dtype=torch.int64)
    return out, logsumexp, None, None, query.shape[2], key.shape[2], seed, offset, None


def backward(run, grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
             max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    grad_q, grad_k, grad_v = run(BACKWARD, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                                 attn_mask=attn_bias, scale=scale)
    return grad_q, grad_k, grad_v, None  # the mask never needs a gradient here (native.cc)
