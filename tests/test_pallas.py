"""Pallas kernels: interpret-mode numerics against eager (forward and backward), kernel choice
per target, and TPU artifacts (tpu_custom_call) exported and compiled without a TPU."""
from __future__ import annotations

import os
import re

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu import events
from benchmarks.models import RMSNorm, TinyDecoder
from tests.helpers import assert_close_tree, compile_tpu

INTERPRET = {"pallas": "interpret"}


def _fwd_bwd(fn, *inputs):
    """Outputs and input grads of fn(*inputs) for a fixed random cotangent."""
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*inputs)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)))
    return out.detach(), [x.grad for x in inputs if x.requires_grad]


def _kernel_choices(name):
    return [e["choice"] for e in events.events() if e["kind"] == "kernel" and e["kernel"] == name]


def _check(fn, *inputs, kernel):
    events.clear()
    expected = _fwd_bwd(fn, *inputs)
    actual = _fwd_bwd(compile_tpu(fn, options=INTERPRET), *inputs)
    assert_close_tree(actual, expected, rtol=1e-4, atol=1e-4)
    assert _kernel_choices(kernel).count("interpret") == 2, "forward and backward both ran the kernel"


def _qkv(b, h, hk, lq, lk, d):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, h, lq, d, generator=g), torch.randn(b, hk, lk, d, generator=g),
            torch.randn(b, hk, lk, d, generator=g))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_interpret(causal):
    q, k, v = _qkv(1, 2, 2, 40, 40, 16)  # 40: not a multiple of the 128 block
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v,
           kernel="flash_attention")


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_flash_attention_masks_interpret(kind):
    q, k, v = _qkv(2, 2, 2, 24, 36, 16)
    g = torch.Generator().manual_seed(1)
    if kind == "bool":
        mask = torch.rand(2, 1, 24, 36, generator=g) > 0.3
        mask[..., 0] = True  # no fully masked row (eager gives NaN there)
    else:
        mask = torch.randn(24, 36, generator=g)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), q, k, v,
           kernel="flash_attention")


def test_flash_attention_gqa_interpret():
    q, k, v = _qkv(1, 4, 2, 20, 20, 16)
    _check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), q, k, v,
           kernel="flash_attention")


def _check_norm_against_eager(norm):
    """Output, input grad and parameter grads of the interpret-mode kernel match eager."""
    x = torch.randn(3, 37, 48)
    events.clear()
    expected = _fwd_bwd(norm, x), {n: p.grad.clone() for n, p in norm.named_parameters()}
    norm.zero_grad()
    actual = _fwd_bwd(compile_tpu(norm, options=INTERPRET), x), {n: p.grad for n, p in norm.named_parameters()}
    assert_close_tree(actual, expected, rtol=1e-4, atol=1e-4)


def test_rms_norm_interpret():
    norm = RMSNorm(48)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48, generator=torch.Generator().manual_seed(2)))
    _check_norm_against_eager(norm)
    assert _kernel_choices("rms_norm") == ["interpret"]  # forward only: its backward is ATen (see pass)


def test_layer_norm_interpret():
    norm = torch.nn.LayerNorm(48)
    with torch.no_grad():
        norm.weight.normal_(generator=torch.Generator().manual_seed(3))
        norm.bias.normal_(generator=torch.Generator().manual_seed(4))
    _check_norm_against_eager(norm)
    assert _kernel_choices("layer_norm") == ["interpret", "interpret"]


def test_cpu_default_uses_xla_and_pass_fuses_rms_norm():
    norm = RMSNorm(16)
    x = torch.randn(4, 16)
    events.clear()
    assert_close_tree(compile_tpu(norm)(x), norm(x))
    assert _kernel_choices("rms_norm") == ["xla"]
    events.clear()
    assert_close_tree(compile_tpu(norm, options={"pallas": "off"})(x), norm(x))
    assert _kernel_choices("rms_norm") == []  # "off" leaves the decomposed graph alone


def _kernel_counts(text):
    calls = re.findall(r'stablehlo\.custom_call @tpu_custom_call.*', text)
    names = [m.group(1) for c in calls if (m := re.search(r'kernel_name = \\?"(\w+)', c))]
    if len(names) != len(calls):  # kernel names live in the backend_config blob
        names = re.findall(r'kernel_name = \\?"(\w+)', text)
    return {n: names.count(n) for n in set(names)}, len(calls)


@pytest.fixture(scope="module")
def decoder_tpu_export():
    torch.manual_seed(0)
    model, idx = TinyDecoder(layers=2).eval(), torch.randint(0, 128, (2, 40))
    return torchtpu.export(model, idx, platforms=("tpu",)), model, idx


def test_export_tpu_custom_calls(decoder_tpu_export):
    exported, model, idx = decoder_tpu_export
    counts, calls = _kernel_counts(exported.stablehlo_text())
    # float32 at torch's default matmul precision: per layer one RMSNorm and one LayerNorm kernel,
    # plus the final RMSNorm; attention is XLA's own (the kernel's matmuls are bfloat16-precise)
    assert counts == {"torchtpu_rms_norm_fwd": 3, "torchtpu_layer_norm_fwd": 2}
    assert calls == 5
    portable = torchtpu.export(model, idx, platforms=("cpu", "tpu")).stablehlo_text()
    assert "custom_call @tpu_custom_call" not in portable  # a multi-platform artifact keeps XLA's own ops


@pytest.mark.parametrize("dtype,precision,kernel", [(torch.bfloat16, "highest", True),
                                                    (torch.float32, "medium", True),
                                                    (torch.float32, "high", False)])
def test_tpu_flash_attention_follows_float32_matmul_precision(dtype, precision, kernel):
    """The Mosaic flash kernel takes bfloat16, and float32 only where torch allows bfloat16
    matmuls (on a TPU v5e its float32 attention was 9e-3 off; XLA's own ops 2e-6)."""
    q, k, v = (t.to(dtype) for t in _qkv(1, 2, 2, 128, 128, 64))
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        events.clear()
        text = torchtpu.export(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               q, k, v, platforms=("tpu",)).stablehlo_text()
    finally:
        torch.set_float32_matmul_precision(before)
    assert ("_flash_attention_kernel" in _kernel_counts(text)[0]) is kernel
    (choice,) = [e for e in events.events() if e["kind"] == "kernel" and e["kernel"] == "flash_attention"]
    assert choice["choice"] == ("mosaic" if kernel else "xla")
    if not kernel:
        assert "bfloat16-precise" in choice["why"]


def test_deviceless_tpu_compile(decoder_tpu_export):
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install libtpu): no deviceless TPU compile")
    import jax
    from jax.experimental import topologies

    exported, _, _ = decoder_tpu_export
    device = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)  # Pallas kernels: one device
    (program,) = exported.programs
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in program.in_avals]
    with jax.enable_x64(True):
        compiled = jax.jit(program.call).trace(*avals).lower().compile()
    text = compiled.as_text()
    assert text and "custom-call" in text


def test_norm_kernels_custom_vjp_interpret():
    """The kernels' own backward (custom_vjp), as JAX callers use it, against jax.grad of the math."""
    import jax
    import jax.numpy as jnp
    from torchtpu.kernels import norms

    k = jax.random.split(jax.random.key(0), 3)
    x, w, b = jax.random.normal(k[0], (3, 37, 48)), jax.random.normal(k[1], (48,)), jax.random.normal(k[2], (48,))

    def rms_ref(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * w

    def ln_ref(x, w, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b

    cases = [(lambda x, w: norms.rms_norm(x, w, interpret=True), rms_ref, (x, w)),
             (lambda x, w, b: norms.layer_norm(x, w, b, interpret=True), ln_ref, (x, w, b))]
    for kernel, ref, args in cases:
        loss = lambda f: (lambda *a: jnp.sum(f(*a) * jnp.cos(f(*a))))  # noqa: E731
        got = jax.grad(loss(kernel), range(len(args)))(*args)
        want = jax.grad(loss(ref), range(len(args)))(*args)
        for g, r in zip(got, want):
            assert float(jnp.max(jnp.abs(g - r))) <= 1e-4 + 1e-4 * float(jnp.max(jnp.abs(r)))


class _LateWeightRMSNorm(torch.nn.Module):
    """Gemma's form: the weight (`1 + w`) is computed after rsqrt, so the fused node lands after
    the chain's own `x * rsqrt`."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x):
        h = x.float()
        norm = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (norm * (1.0 + self.weight.float())).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_late_weight_keeps_graph_order(dtype):
    norm = _LateWeightRMSNorm(16).to(dtype)
    x = torch.randn(4, 16, dtype=dtype)
    events.clear()
    with torch.no_grad():
        assert_close_tree(compile_tpu(norm)(x), norm(x), rtol=1e-2 if dtype == torch.bfloat16 else 1e-4)
    assert _kernel_choices("rms_norm") == ["xla"]


def test_pass_that_breaks_graph_order_is_named():
    from torchtpu.passes.manager import PassInvariantError, run_passes

    def misorder(gm, options):  # moves the first op after its reader
        first = next(n for n in gm.graph.nodes if n.op == "call_function")
        next(iter(first.users)).append(first)
        return gm

    gm = torch.fx.symbolic_trace(lambda x: torch.neg(torch.relu(x)))
    with pytest.raises(PassInvariantError, match="graph pass 'misorder' left an invalid graph"):
        run_passes(gm, None, passes=[("misorder", misorder)])
