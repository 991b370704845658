"""The compiled attention (compiler/rules/attention.py): torch's numbers, the forward through ATen's
kernel on the CPU, the backward from the saved output and logsumexp through ATen's kernel where it
pays, and both through XLA's own ops with aten_kernels="off" (the form a TPU or GPU target lowers)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers import compile_tpu
from torchtpu.kernels import aten_cpu

NEEDS_CXX = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                               reason="no C++ compiler: the ATen kernels cannot be built")
TARGET = "torchtpu_aten_attention_backward"
FORWARD = "@torchtpu_aten_attention_forward("


def _case(case, dtype):
    torch.manual_seed(0)
    kv_heads = 2 if case == "gqa" else 4
    q = torch.randn(2, 4, 16, 8, dtype=dtype)
    k, v = torch.randn(2, kv_heads, 12, 8, dtype=dtype), torch.randn(2, kv_heads, 12, 8, dtype=dtype)
    kw = {"causal": {"is_causal": True}, "gqa": {"enable_gqa": True}, "scale": {"scale": 0.3}}.get(case, {})
    if case == "masked_rows":  # a float mask with two rows masked everywhere
        mask = torch.randn(2, 1, 16, 12, dtype=dtype)
        mask[:, :, 3] = mask[1, :, 9] = -float("inf")
        kw = {"attn_mask": mask}
    elif case == "bool_mask":  # torch makes it additive before the fused op; a row masked everywhere
        mask = torch.rand(2, 4, 16, 12) > 0.3
        mask[1, :, 5] = False
        kw = {"attn_mask": mask}
    elif case == "float_mask_2d":
        kw = {"attn_mask": torch.randn(16, 12, dtype=dtype)}
    return (q, k, v), kw


def _grads(fn, inputs, kw, dtype=None):
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_() for x in inputs]
    kw = {n: t.to(dtype) if dtype and isinstance(t, torch.Tensor) and t.is_floating_point() else t
          for n, t in kw.items()}
    out = fn(*leaves, **kw)
    torch.manual_seed(1)
    out.backward(torch.randn(out.shape).to(out.dtype))
    return [t.detach().float() for t in (out, *[x.grad for x in leaves])]


def _compiled(tmp_path, **options):
    return compile_tpu(F.scaled_dot_product_attention, options={"dump_dir": str(tmp_path), **options})


def _programs(tmp_path) -> str:
    return "\n".join(p.read_text() for p in tmp_path.glob("*.stablehlo.mlir"))


@NEEDS_CXX
@pytest.mark.parametrize("aten", ["auto", "off"])
@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "scale", "masked_rows", "bool_mask", "float_mask_2d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_eager(tmp_path, case, aten, dtype):
    """Inference: on the CPU the forward is torch's kernel, so its numbers are eager's (bfloat16
    too, rounded once from float32 where the CPU lacks bfloat16 instructions); XLA's ops with
    aten_kernels="off"."""
    inputs, kw = _case(case, dtype)
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(*inputs, **kw).float()
        got = _compiled(tmp_path, aten_kernels=aten)(*inputs, **kw).float()
        reference = F.scaled_dot_product_attention(*(x.float() for x in inputs),
                                                   **{n: t.float() if isinstance(t, torch.Tensor)
                                                      and t.is_floating_point() else t for n, t in kw.items()})
    assert not got.isnan().any()
    if aten == "auto" and (dtype == torch.float32 or aten_cpu.native_bfloat16()):
        assert torch.equal(got, expected)  # eager's kernel, eager's bits
    if dtype == torch.float32:
        assert (got - expected).abs().max().item() < 2e-6
    else:
        assert (got - reference).abs().max().item() <= 1.25 * (expected - reference).abs().max().item() + 1e-3
    assert (FORWARD in _programs(tmp_path)) == (aten == "auto")


@NEEDS_CXX
@pytest.mark.parametrize("aten", ["auto", "off"])
@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "scale", "masked_rows", "bool_mask", "float_mask_2d"])
def test_backward_matches_eager(tmp_path, case, aten):
    inputs, kw = _case(case, torch.float32)
    expected = _grads(F.scaled_dot_product_attention, inputs, kw)
    got = _grads(_compiled(tmp_path, aten_kernels=aten), inputs, kw)
    for g, e in zip(got, expected):
        assert not g.isnan().any()
        assert (g - e).abs().max().item() < 2e-5
    # ATen's kernel on the CPU (GQA's kv heads repeated for it, their gradients summed back);
    # each case's backward signature is its own, so no case reuses another's program
    assert (TARGET in _programs(tmp_path)) == (aten == "auto")


@NEEDS_CXX
@pytest.mark.parametrize("aten", ["auto", "off"])
@pytest.mark.parametrize("case", ["plain", "causal", "masked_rows", "bool_mask"])
def test_bfloat16_no_worse_than_eager_against_float32(tmp_path, case, aten):
    inputs, kw = _case(case, torch.float32)
    reference = _grads(F.scaled_dot_product_attention, inputs, kw)
    eager = _grads(F.scaled_dot_product_attention, inputs, kw, torch.bfloat16)
    got = _grads(_compiled(tmp_path, aten_kernels=aten), inputs, kw, torch.bfloat16)
    for g, e, r in zip(got, eager, reference):
        assert (g - r).abs().max().item() <= 1.25 * (e - r).abs().max().item() + 1e-3


@NEEDS_CXX
@pytest.mark.parametrize("head_dim, length, aten", [(32, 65, False), (16, 128, False), (8, 65, True),
                                                    (32, 129, True)])
def test_cpu_backward_is_torchs_kernel_only_where_it_pays(tmp_path, head_dim, length, aten):
    """On the CPU the backward calls torch's kernel only for heads narrower than 16 or more than
    128 x 128 scores per head; XLA's ops elsewhere (docs/DECISIONS.md 113). Both match eager."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, length, head_dim) for _ in range(3))
    expected = _grads(F.scaled_dot_product_attention, (q, k, v), {"is_causal": True})
    got = _grads(_compiled(tmp_path), (q, k, v), {"is_causal": True})
    for g, e in zip(got, expected):
        assert (g - e).abs().max().item() < 2e-5
    assert (TARGET in _programs(tmp_path)) is aten


_POOLED = r'''
import torch, torch.nn.functional as F
from helpers import compile_tpu
torch.manual_seed(0)
masks = {"none": None, "2d": torch.randn(16, 12), "batch_1": torch.randn(1, 3, 16, 12), "heads_1": torch.randn(2, 1, 16, 12)}
for batch in (1, 2):
    for name, mask in masks.items():
        if name == "heads_1" and batch == 1:
            continue
        q, k, v = (torch.randn(batch, 3, n, 8, requires_grad=True) for n in (16, 12, 12))
        kw = {} if mask is None else {"attn_mask": mask}
        attend = lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw)
        compiled = compile_tpu(attend)
        with torch.no_grad():
            assert torch.equal(compiled(q, k, v, **kw), attend(q, k, v, **kw)), (batch, name)
        torch.manual_seed(1)
        grad = torch.randn(batch, 3, 16, 8)
        got = torch.autograd.grad(compiled(q, k, v, **kw), (q, k, v), grad)
        want = torch.autograd.grad(attend(q, k, v, **kw), (q, k, v), grad)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), (batch, name)
import copy
conv = torch.nn.Conv2d(4, 8, 3, padding=1).eval()
channels_last = copy.deepcopy(conv).to(memory_format=torch.channels_last)  # the kernel eager runs then
for batch in (2, 3, 5):  # split into ranges of 1 to 3 (a batch of 1 is never split)
    x = torch.randn(batch, 4, 10, 10)
    with torch.no_grad():
        want = channels_last(x.contiguous(memory_format=torch.channels_last))
        assert torch.equal(compile_tpu(conv)(x), want), batch
print("pooled ok")
'''


@NEEDS_CXX
@pytest.mark.parametrize("threads", [1, 3])
def test_kernels_split_over_xlas_pool_keep_eagers_bits(threads):
    """On a pool of several threads the attention kernels and the convolution run in blocks of
    (batch, heads) or batch ranges, one per pool thread at one thread each; on a pool of one, whole,
    on ATen's threads (kernels/aten_cpu.cc OnPool). Either way eager's bits: masks that broadcast
    over batch or heads or both, a batch of one (split by heads), batches that do not divide."""
    from helpers import run_python

    env = {**os.environ, "PJRT_NPROC": str(threads), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    assert "pooled ok" in run_python(_POOLED, env=env, timeout=600)


@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "scale", "masked_rows", "bool_mask", "float_mask_2d"])
def test_off_cpu_float32_backward_renormalizes_instead_of_trusting_the_logsumexp(case):
    """On a TPU target the float32 attention backward recomputes P from its row max and sum (on a
    v5e P = exp(S - lse) put dq/dk/dv 2.8e-5 off float64, renormalized 1.1e-6: DECISIONS 129); the
    CPU keeps the logsumexp form. The rule run on the CPU as each target would lower it: every
    form within float32 rounding of float64, and only the CPU's reading the saved logsumexp."""
    import types

    import jax
    import numpy as np

    from torchtpu.compiler.rules.attention import _sdpa_flash_cpu, _sdpa_flash_cpu_backward
    from torchtpu.options import Options

    (q, k, v), kw = _case(case, torch.float32)
    expected = _grads(F.scaled_dot_product_attention, (q, k, v), kw, torch.float64)
    if kw.pop("enable_gqa", False):
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # the graph's own expansion
    mask = kw.get("attn_mask")
    if mask is not None and mask.dtype == torch.bool:  # torch makes it additive before the fused op
        mask = torch.zeros(mask.shape).masked_fill(~mask, -float("inf"))
    torch.manual_seed(1)
    grad_out = torch.randn(expected[0].shape)
    j = lambda t: None if t is None else jax.numpy.asarray(t.numpy())  # noqa: E731
    grads = {}
    for platform in ("tpu", "cpu"):
        ctx = types.SimpleNamespace(options=Options.parse({"aten_kernels": "off"}), platform=platform,
                                    node=types.SimpleNamespace(meta={}, name="sdpa"))
        args = dict(attn_mask=j(mask), scale=kw.get("scale"))
        out, lse = _sdpa_flash_cpu(ctx, j(q), j(k), j(v), 0.0, kw.get("is_causal", False), **args)
        for shift in (0.0, 0.5):  # a wrong logsumexp: read by the CPU's form only
            dq, dk, dv = _sdpa_flash_cpu_backward(ctx, j(grad_out), j(q), j(k), j(v), out, lse + shift, 0.0,
                                                  kw.get("is_causal", False), **args)
            grads[platform, shift] = [torch.from_numpy(np.array(g)) for g in (dq, dk, dv)]
    for name, got, want in zip("qkv", grads["tpu", 0.0], expected[1:]):
        got = got if got.shape == want.shape else got.reshape(*want.shape[:2], -1, *got.shape[2:]).sum(2)
        assert torch.isfinite(got).all()
        assert (got.double() - want.double()).norm() <= 2e-6 * want.double().norm(), name
    for t, c in zip(grads["tpu", 0.0], grads["cpu", 0.0]):
        torch.testing.assert_close(t, c, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(grads["tpu", 0.0], grads["tpu", 0.5]))
    assert not all(torch.allclose(a, b) for a, b in zip(grads["cpu", 0.0], grads["cpu", 0.5]))
