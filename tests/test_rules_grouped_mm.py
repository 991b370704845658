"""Grouped matmuls (MoE experts): `aten._grouped_mm` in each layout and transformers'
`grouped_mm_fallback` op, forward and gradients against eager; tiny MoE models with no host
ops; the TPU form (megablox kernels as `tpu_custom_call`) exported and compiled without a TPU."""
from __future__ import annotations

import copy
import os
import re
import types

import jax
import numpy as np
import pytest
import torch

import torchtpu
from torchtpu import events
from torchtpu.compiler.rules.grouped_mm import grouped_mm
from torchtpu.options import Options
from helpers import assert_close_tree, compile_tpu, fresh_caches, grads_of

transformers = pytest.importorskip("transformers")
from transformers.integrations import moe as _hf_moe  # noqa: E402,F401  (defines torch.ops.transformers.*)

BF16 = dict(rtol=1.6e-2, atol=1e-2)  # bf16 results that round one float32 accumulation, as eager's do
OFFS = [5, 5, 20, 32]  # group ends: group 1 is empty, the last ends at the ragged dimension's size
LAYOUTS = {  # name: (mat_a shape, mat_b shape), with 4 groups; eager wants 16-byte aligned strides
    "rows": ((32, 16), (4, 16, 8)),  # [M, K] x [G, K, N] -> [M, N]: the MoE forward
    "columns": ((4, 8, 16), (16, 32)),  # [G, M, K] x [K, N] -> [M, N]
    "contraction": ((8, 32), (32, 16)),  # [M, K] x [K, N] -> [G, M, N]: the expert weights' grad
    "batched": ((4, 8, 16), (4, 16, 8)),  # [G, M, K] x [G, K, N] -> [G, M, N], no offs
}


def _operands(layout, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_a, shape_b = LAYOUTS[layout]
    offs = None if layout == "batched" else torch.tensor(OFFS, dtype=torch.int32)
    return torch.randn(shape_a, generator=g).to(dtype), torch.randn(shape_b, generator=g).to(dtype), offs


def _fwd_bwd(fn, *inputs):
    """Output and the floating inputs' grads of fn(*inputs) for a fixed random cotangent."""
    inputs = [x.detach().clone().requires_grad_(x.is_floating_point()) if x is not None else None for x in inputs]
    out = fn(*inputs)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype))
    return out.detach(), [x.grad for x in inputs if x is not None and x.requires_grad]


def _kernel_choices():
    return [e["choice"] for e in events.events() if e["kind"] == "kernel" and e["kernel"] == "grouped_matmul"]


@pytest.mark.parametrize("pallas", ["auto", "interpret"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grouped_mm_bf16_forward_and_grads(layout, pallas):
    """torch traces `_grouped_mm` in bfloat16 only; its backward is `_grouped_mm` on transposes."""
    fn = lambda a, b, offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
    a, b, offs = _operands(layout, torch.bfloat16)
    expected = _fwd_bwd(fn, a, b, offs)
    torchtpu.reset_stats()
    events.clear()
    actual = _fwd_bwd(compile_tpu(fn, options={"pallas": pallas}), a, b, offs)
    assert_close_tree(actual, expected, **BF16)
    assert torchtpu.stats()["fallback_ops"] == 0
    ragged = 0 if layout == "batched" else 3  # forward and the two grads
    assert _kernel_choices() == [{"auto": "xla", "interpret": "interpret"}[pallas]] * ragged


def test_grouped_mm_out_dtype_bf16():
    a, b, offs = _operands("rows", torch.bfloat16)
    fn = lambda a, b, offs: torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16)  # noqa: E731
    assert_close_tree(compile_tpu(fn)(a, b, offs), fn(a, b, offs), **BF16)


def test_grouped_mm_rows_past_the_last_group_are_zero():
    """Eager leaves them unwritten; here they are zeros, forward and in the input's grad."""
    a, b, _ = _operands("rows", torch.bfloat16)
    offs = torch.tensor([5, 5, 20, 26], dtype=torch.int32)
    fn = lambda a, b, offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
    (out, (grad_a, grad_b)), (want, (want_a, want_b)) = _fwd_bwd(compile_tpu(fn), a, b, offs), _fwd_bwd(fn, a, b, offs)
    torch.testing.assert_close(out[:26], want[:26], **BF16)
    torch.testing.assert_close(grad_a[:26], want_a[:26], **BF16)
    torch.testing.assert_close(grad_b, want_b, **BF16)
    assert not out[26:].any() and not grad_a[26:].any()


def _rule(a, b, offs, pallas):
    """The lowering rule on its own, as lower_node calls it (x64 on)."""
    ctx = types.SimpleNamespace(options=Options.parse({"pallas": pallas}), platform="cpu",
                                node=types.SimpleNamespace(meta={}, name="grouped_mm"))
    jnp_of = lambda t: None if t is None else jax.numpy.asarray(t.numpy())  # noqa: E731
    with jax.enable_x64(True):
        return torch.from_numpy(np.array(grouped_mm(ctx, jnp_of(a), jnp_of(b), jnp_of(offs))))


@pytest.mark.parametrize("pallas", ["off", "interpret"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grouped_mm_float32_rule_forward_and_grads(layout, pallas):
    """float32 `_grouped_mm` runs eagerly but does not trace (torch's meta function wants bf16),
    so the rule is checked directly: the forward, and the two `_grouped_mm`s AOTAutograd's
    backward is made of, against eager autograd."""
    a, b, offs = _operands(layout, torch.float32)
    want, (want_a, want_b) = _fwd_bwd(lambda a, b: torch._grouped_mm(a, b, offs=offs), a, b)
    cotangent = torch.randn(want.shape, generator=torch.Generator().manual_seed(7))
    got = _rule(a, b, offs, pallas)
    got_a = _rule(cotangent, b.transpose(-2, -1).contiguous(), offs, pallas)
    got_b = _rule(a.transpose(-2, -1).contiguous(), cotangent, offs, pallas)
    assert_close_tree((got, got_a, got_b), (want, want_a, want_b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offs_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformers_grouped_mm_fallback(dtype, offs_dtype):
    """transformers' custom op (its float32 route) and its backward op run on the device."""
    x, w, _ = _operands("rows", dtype)
    offs = torch.tensor(OFFS, dtype=offs_dtype)
    fn = lambda x, w, offs: torch.ops.transformers.grouped_mm_fallback(x, w, offs)  # noqa: E731
    expected = _fwd_bwd(fn, x, w, offs)
    torchtpu.reset_stats()
    actual = _fwd_bwd(compile_tpu(fn), x, w, offs)
    assert_close_tree(actual, expected, **(BF16 if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)))
    assert torchtpu.stats()["fallback_ops"] == 0


# --- models ----------------------------------------------------------------------------------

def _moe_model(kind, dtype):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, num_experts_per_tok=2, use_cache=False,
                  attn_implementation="sdpa")
    if kind == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(**common, num_experts=4, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=64)
        model = transformers.Qwen2MoeForCausalLM(config)
    else:
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**common, num_local_experts=4))
    return model.to(dtype).eval()


IDS = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))


def _tolerance(dtype):
    # bf16: eager and compiled round differently through 2 layers; routing agrees on these inputs
    return dict(rtol=1e-3, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-2)


GRAD_ERROR = {torch.float32: 1e-3, torch.bfloat16: 4e-2}  # max |compiled - eager| / max |eager|, per parameter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_moe_model_inference_has_no_host_ops(kind, dtype):
    model = _moe_model(kind, dtype)
    torchtpu.reset_stats()
    with torch.no_grad():
        expected, actual = model(IDS).logits, compile_tpu(model)(IDS).logits
    assert torchtpu.stats()["fallback_ops"] == 0
    assert_close_tree(actual, expected, **_tolerance(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("kind", ["qwen2_moe", "mixtral"])
def test_moe_model_training_has_no_host_ops(kind, dtype):
    model = _moe_model(kind, dtype)
    compiled_model = copy.deepcopy(model)

    def step(m):
        logits = m(IDS).logits
        logits.float().pow(2).mean().backward()
        return logits.detach()

    expected = step(model)
    torchtpu.reset_stats()
    actual = step(compile_tpu(compiled_model))
    assert torchtpu.stats()["fallback_ops"] == 0
    assert_close_tree(actual, expected, **_tolerance(dtype))
    want, got = grads_of(model), grads_of(compiled_model)
    assert want.keys() == got.keys() and any("experts" in n for n in want)
    errors = {n: ((got[n].float() - g.float()).abs().max() / g.float().abs().max()).item() for n, g in want.items()}
    assert max(errors.values()) <= GRAD_ERROR[dtype], sorted(errors.items(), key=lambda e: -e[1])[:3]


# --- the TPU form ----------------------------------------------------------------------------

def _three_layouts(a, w, offs, a3, a2, b2):
    return (torch._grouped_mm(a, w, offs=offs), torch._grouped_mm(a3, b2, offs=offs),
            torch._grouped_mm(a2, b2.T.contiguous(), offs=offs))


@pytest.fixture(scope="module")
def tpu_export():
    g = torch.Generator().manual_seed(0)
    bf = dict(generator=g, dtype=torch.bfloat16)
    offs = torch.tensor([40, 40, 100, 160], dtype=torch.int32)
    args = (torch.randn(160, 64, **bf), torch.randn(4, 64, 256, **bf), offs, torch.randn(4, 32, 64, **bf),
            torch.randn(48, 160, **bf), torch.randn(64, 160, **bf))
    return torchtpu.export(_three_layouts, *args, platforms=("tpu",)), args


def test_tpu_export_uses_megablox_kernels(tpu_export):
    exported, args = tpu_export
    # one kernel per ragged layout (gmm, gmm with a transposed rhs, tgmm); megablox names them "kernel"
    assert re.findall(r'kernel_name = \\?"(\w+)', exported.stablehlo_text()) == ["kernel"] * 3
    portable = torchtpu.export(_three_layouts, *args, platforms=("cpu", "tpu")).stablehlo_text()
    assert "custom_call @tpu_custom_call" not in portable  # a multi-platform artifact keeps XLA's ops


@pytest.mark.parametrize("precision,kernel", [("medium", True), ("high", False), ("highest", False)])
def test_tpu_float32_grouped_mm_follows_float32_matmul_precision(precision, kernel):
    """megablox's matmuls are bfloat16-precise: float32 takes them only where torch allows bfloat16
    matmuls (on a TPU v5e a float32 Mixtral's gradients were 5e-3 off with them)."""
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(160, 64, generator=g), torch.randn(4, 64, 256, generator=g)
    offs = torch.tensor([40, 40, 100, 160], dtype=torch.int32)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        events.clear()
        # float32 MoE layers call transformers' op (torch 2.13 traces _grouped_mm in bfloat16 only)
        text = torchtpu.export(lambda a, w, offs: torch.ops.transformers.grouped_mm_fallback(a, w, offs),
                               a, w, offs, platforms=("tpu",)).stablehlo_text()
    finally:
        torch.set_float32_matmul_precision(before)
    assert ("custom_call @tpu_custom_call" in text) is kernel
    (choice,) = [e for e in events.events() if e["kind"] == "kernel" and e["kernel"] == "grouped_matmul"]
    assert choice["choice"] == ("mosaic" if kernel else "xla")
    if not kernel:
        assert "bfloat16-precise" in choice["why"]
        # XLA's ragged dot at torch's precision: bfloat16 x3 for "high", full float32 for "highest"
        assert "chlo.ragged_dot" in text and f'precision_config = ["{precision.upper()}"' in text


def test_tpu_export_moe_model():
    exported = torchtpu.export(_moe_model("mixtral", torch.bfloat16), IDS, platforms=("tpu",))
    text = exported.stablehlo_text()
    # 2 layers x (gate_up, down): one jitted gmm per shape, each called by both layers
    assert re.findall(r'kernel_name = \\?"(\w+)', text).count("kernel") == 2
    calls = re.findall(r"call @(gmm\w*)\(", text)
    assert len(calls) == 4 and len(set(calls)) == 2


def test_deviceless_tpu_compile_grouped_mm(tpu_export):
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install libtpu): no deviceless TPU compile")
    from jax.experimental import topologies

    exported, _ = tpu_export
    device = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)  # Pallas kernels: one device
    (program,) = exported.programs
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in program.in_avals]
    with jax.enable_x64(True):
        text = jax.jit(program.call).trace(*avals).lower().compile().as_text()
    assert text.count('custom_call_target="tpu_custom_call"') == 3


def test_rule_named_for_another_library_registers_once():
    from torchtpu.compiler import registry

    assert registry.lookup(torch.ops.transformers.grouped_mm_fallback.default) is not None
    with pytest.raises(registry.DuplicateRuleError, match="grouped_mm_fallback"):
        registry.op("transformers.grouped_mm_fallback.default")(lambda ctx, *args: None)


_ATEN = pytest.mark.skipif(not __import__("torchtpu.kernels.aten_cpu", fromlist=["x"]).available(),
                           reason="ATen's CPU kernels could not be built here (no C++ compiler): XLA's ragged dot is used")


def _programs(fn, inputs, tmp_path, **options) -> tuple:
    """fn compiled with these options, from empty caches: its result and its StableHLO text."""
    torch._dynamo.reset()
    with fresh_caches(tmp_path / "cache"), torch.no_grad():
        out = compile_tpu(fn, options={"dump_dir": str(tmp_path), **options})(*inputs)
    return out, "\n".join(p.read_text() for p in tmp_path.glob("*.stablehlo.mlir"))


@_ATEN
@pytest.mark.parametrize("layout", ["rows", "columns", "contraction"])
def test_cpu_grouped_mm_calls_aten_and_equals_eager(layout, tmp_path):
    """On the CPU the products are ATen's own `_grouped_mm` (a custom call: XLA's ragged dot
    computes every group for every row), so they equal eager's bit for bit; on a CPU without
    bfloat16 instructions the kernel runs in float32 and rounds once (aten_cpu.native_bfloat16),
    equal bit for bit to that; with the ATen kernels off they are XLA's ragged dot, equal
    within rounding."""
    from torchtpu.kernels import aten_cpu

    a, b, offs = _operands(layout, torch.bfloat16)
    fn = lambda a, b, offs: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
    expected = (fn(a, b, offs) if aten_cpu.native_bfloat16()
                else fn(a.float(), b.float(), offs).bfloat16())
    got, text = _programs(fn, (a, b, offs), tmp_path / "on")
    off, text_off = _programs(fn, (a, b, offs), tmp_path / "off", aten_kernels="off")
    assert "torchtpu_aten_grouped_mm" in text and "ragged_dot" not in text
    assert "torchtpu_aten_grouped_mm" not in text_off
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(off, expected, **BF16)


@_ATEN
def test_cpu_grouped_mm_fallback_in_float32_calls_aten(tmp_path):
    """transformers' float32 route (its grouped_mm_fallback op) takes the same custom call."""
    x, w, offs = _operands("rows", torch.float32)
    fn = lambda x, w, offs: torch.ops.transformers.grouped_mm_fallback(x, w, offs)  # noqa: E731
    got, text = _programs(fn, (x, w, offs), tmp_path)
    assert "torchtpu_aten_grouped_mm" in text
    torch.testing.assert_close(got, fn(x, w, offs), rtol=1e-5, atol=1e-5)
