"""scaled_dot_product_attention on tpu tensors: one fused op each way (device/native.cc,
device/attention.py), torch's numbers, and torch's math path where the fused op does not apply."""
from __future__ import annotations

import collections
import os

import helpers
import pytest
import torch

import torchtpu
import torchtpu.device
from torchtpu.device import native, strict

FUSED = {"aten._scaled_dot_product_flash_attention_for_cpu.default",
         "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}

pytestmark = pytest.mark.skipif(not native.load(),
                                reason=f"the device's C++ registrations are not built: {native._state.get('why')}")


@pytest.fixture
def ops(monkeypatch):
    seen = collections.Counter()
    run = strict.run

    def counting(op, args, kwargs):
        seen[str(op)] += 1
        return run(op, args, kwargs)

    monkeypatch.setattr(strict, "run", counting)
    return seen


def _case(case, dtype):
    torch.manual_seed(0)
    heads = 2 if case == "gqa" else 4
    q = torch.randn(2, 4, 16, 8, dtype=dtype)
    k, v = torch.randn(2, heads, 16, 8, dtype=dtype), torch.randn(2, heads, 16, 8, dtype=dtype)
    kw = {"causal": {"is_causal": True}, "gqa": {"enable_gqa": True}, "scale": {"scale": 0.3},
          "bool_mask": {"attn_mask": torch.rand(2, 1, 16, 16) > 0.3},
          "float_mask": {"attn_mask": torch.randn(2, 1, 16, 16, dtype=dtype)}}.get(case, {})
    return (q, k, v), kw


def _run(inputs, kw, device, dtype=None):
    leaves = [x.detach().to(device=device, dtype=dtype or x.dtype).requires_grad_() for x in inputs]
    kw = {n: (t.to(device=device, dtype=dtype if t.is_floating_point() and dtype else t.dtype)
              if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, **kw)
    torch.manual_seed(1)
    out.backward(torch.randn(out.shape, dtype=out.dtype).to(device))
    return [t.detach().cpu().float() for t in (out, *[x.grad for x in leaves])]


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("case", ["plain", "causal", "gqa", "scale", "bool_mask", "float_mask"])
def test_one_fused_op_each_way_with_torchs_numbers(case, mode, ops):
    inputs, kw = _case(case, torch.float32)
    expected = _run(inputs, kw, "cpu")
    with torchtpu.eager_mode(mode):
        got = _run(inputs, kw, "tpu")
    for g, e in zip(got, expected):
        assert (g - e).abs().max().item() < 2e-5
    assert all(ops[name] == 1 for name in FUSED), dict(ops)
    assert not {"aten.bmm.default", "aten._softmax.default"} & set(ops), dict(ops)  # not the math path


@pytest.mark.parametrize("case", ["plain", "causal", "float_mask"])
def test_bfloat16_no_worse_than_eager_against_float32(case, ops):
    inputs, kw = _case(case, torch.float32)
    reference = _run(inputs, kw, "cpu")
    eager = _run(inputs, kw, "cpu", torch.bfloat16)
    got = _run(inputs, kw, "tpu", torch.bfloat16)
    assert all(ops[name] == 1 for name in FUSED), dict(ops)
    for g, e, r in zip(got, eager, reference):
        assert (g - r).abs().max().item() <= 1.25 * (e - r).abs().max().item() + 1e-3


def test_dropout_and_a_mask_that_needs_a_gradient_take_torchs_math_path(ops):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, device="tpu")
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape and not FUSED & set(ops) and ops["aten.bmm.default"] == 2
    ops.clear()
    mask = torch.zeros(2, 1, 16, 16, device="tpu", requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    out.sum().backward()
    assert not FUSED & set(ops) and mask.grad is not None and mask.grad.shape == mask.shape


def test_torch_compile_on_tpu_tensors_keeps_its_graph():
    """Under Dynamo and AOTAutograd the stub sees traced tensors and answers math, so compiled
    graphs are what they were (the compiler fuses attention itself)."""
    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    got = torch.compile(f, backend="tpu", fullgraph=True)(q.to("tpu"), k.to("tpu"), v.to("tpu"))
    assert (got.cpu() - f(q, k, v)).abs().max().item() < 2e-5


def test_without_the_library_attention_takes_torchs_math_path():
    script = ("import torch, torchtpu.device\n"
              "from torchtpu.device import native\n"
              "torch.manual_seed(0)\n"
              "q = torch.randn(2, 4, 16, 8)\n"
              "out = torch.nn.functional.scaled_dot_product_attention(q.to('tpu'), q.to('tpu'), q.to('tpu'))\n"
              "ref = torch.nn.functional.scaled_dot_product_attention(q, q, q)\n"
              "print(native.loaded(), native._state['why'], float((out.cpu() - ref).abs().max()))\n")
    out = helpers.run_python(script, env={**os.environ, "TORCHTPU_DEVICE_NATIVE": "0"}).split()
    assert out[0] == "False" and "TORCHTPU_DEVICE_NATIVE is off" in " ".join(out[1:-1]) and float(out[-1]) < 2e-5
