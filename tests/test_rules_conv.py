"""Convolution, pooling and grid sampling: forward values and gradients against eager."""
from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.nn.utils.parametrizations import weight_norm

import torchtpu
from helpers import assert_close_tree, assert_matches_eager, compile_tpu, fresh_caches


def _forward_and_grads(module, x, compiled):
    """Output, d(loss)/d(input) and parameter grads of a weighted-sum loss."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = (module if compiled is None else compiled)(x)
    weights = torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)
    (out * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    return out.detach(), x.grad.detach().clone(), grads


def _check_module(module, x, rtol=1.3e-4, atol=1e-4):
    expected = _forward_and_grads(module, x, None)
    actual = _forward_and_grads(module, x, compile_tpu(module))
    assert_close_tree(actual, expected, rtol=rtol, atol=atol)
    # The gradient really flows (not all zero), so the comparison means something.
    assert expected[1].abs().sum() > 0
    return actual


CASES = {
    "conv2d_strided_padded_grouped": (
        lambda: torch.nn.Conv2d(6, 9, kernel_size=(3, 2), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=3),
        (2, 6, 11, 9)),
    "conv_transpose2d": (
        lambda: torch.nn.ConvTranspose2d(4, 6, kernel_size=3, stride=2, padding=1, output_padding=1, groups=2),
        (2, 4, 5, 7)),
    "conv1d": (lambda: torch.nn.Conv1d(3, 5, kernel_size=4, stride=3, padding=2), (2, 3, 17)),
    # depthwise: on the CPU a sum of shifted slices, one per kernel tap
    "depthwise_conv2d_strided_dilated": (
        lambda: torch.nn.Conv2d(5, 5, kernel_size=(3, 4), stride=(2, 3), padding=(2, 1), dilation=(2, 1), groups=5),
        (2, 5, 13, 12)),
    "depthwise_conv1d": (lambda: torch.nn.Conv1d(4, 4, kernel_size=5, padding=2, groups=4), (3, 4, 9)),
    "depthwise_multiplier_conv2d": (lambda: torch.nn.Conv2d(3, 6, kernel_size=3, groups=3), (2, 3, 7, 7)),
    "grouped_conv3d": (lambda: torch.nn.Conv3d(4, 6, kernel_size=2, stride=2, padding=1, groups=2), (1, 4, 5, 6, 7)),
    "conv3d": (lambda: torch.nn.Conv3d(2, 4, kernel_size=2, stride=(1, 2, 2), padding=1), (1, 2, 5, 6, 7)),
    "max_pool2d": (lambda: torch.nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 10)),
    "max_pool2d_ceil_dilated": (lambda: torch.nn.MaxPool2d(2, stride=2, dilation=2, ceil_mode=True), (2, 3, 9, 10)),
    "max_pool3d": (lambda: torch.nn.MaxPool3d(2, stride=2, padding=1), (1, 2, 5, 6, 7)),
    "avg_pool2d_ceil": (lambda: torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 10, 9)),
    "avg_pool2d_no_pad_count": (
        lambda: torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (2, 3, 10, 9)),
    "avg_pool2d_divisor": (lambda: torch.nn.AvgPool2d(2, stride=1, divisor_override=3), (2, 3, 6, 5)),
    "avg_pool3d_ceil": (lambda: torch.nn.AvgPool3d(2, stride=2, ceil_mode=True), (1, 2, 5, 6, 7)),
    "adaptive_avg_pool2d": (lambda: torch.nn.AdaptiveAvgPool2d((3, 4)), (2, 3, 7, 10)),
    "adaptive_avg_pool3d": (lambda: torch.nn.AdaptiveAvgPool3d((2, 3, 4)), (1, 2, 5, 7, 9)),
    "adaptive_max_pool2d": (lambda: torch.nn.AdaptiveMaxPool2d((3, 4)), (2, 3, 7, 10)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_grads(name):
    torch.manual_seed(0)
    make, shape = CASES[name]
    _check_module(make(), torch.randn(shape))


@pytest.mark.parametrize("dim", [0, 2])  # 2, the last: wav2vec2's positional convolution
def test_weight_norm_forward_and_grads_on_device(dim):
    """_weight_norm_interface's backward has a rule: no op of the training graphs runs on the host."""
    torch.manual_seed(0)
    torchtpu.reset_stats()
    _check_module(weight_norm(torch.nn.Conv1d(4, 6, kernel_size=5, padding=2, groups=2), dim=dim), torch.randn(2, 4, 9))
    assert torchtpu.stats()["fallback_ops"] == 0


def test_wav2vec2_training_runs_on_device():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
        mask_time_prob=0.0)
    model = transformers.Wav2Vec2Model(config).eval()  # eval: no dropout, no feature-encoder requires_grad flip
    wave = torch.randn(2, 400)
    hidden = lambda w: model(w).last_hidden_state  # noqa: E731
    expected = _forward_and_grads(model, wave, hidden)
    torchtpu.reset_stats()
    actual = _forward_and_grads(model, wave, compile_tpu(hidden))
    assert torchtpu.stats()["fallback_ops"] == 0
    # the key projections' bias grads are 0 in exact arithmetic (softmax ignores a per-row shift): ~1e-9 either way
    for grads in (expected[2], actual[2]):
        for name in [n for n in grads if n.endswith("k_proj.bias")]:
            assert grads.pop(name).abs().max() < 1e-6
    assert_close_tree(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_max_pool_propagates_a_lone_nan_in_every_window_shape(nd, dtype):
    # One NaN in the input reaches exactly the windows that hold it, for every kernel, stride,
    # padding, dilation and ceil_mode (XLA:CPU's own max reduce_window lost it in 2x2x2 windows)
    torch.manual_seed(0)
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
    x = torch.randn((2, 3) + (9,) * nd, dtype=dtype)
    x.view(-1)[5] = float("nan")
    for k, s, p, d, ceil in [(2, 2, 0, 1, False), (2, 2, 1, 1, True), (3, 2, 1, 1, False), (3, 1, 1, 2, True),
                             (2, 1, 0, 2, False)]:
        fn = lambda t: pool(t, k, s, p, d, ceil_mode=ceil)  # noqa: E731
        torch._dynamo.reset()
        with torch.no_grad():
            torch.testing.assert_close(compile_tpu(fn)(x), fn(x), rtol=0, atol=0, equal_nan=True)


def test_max_pool_indices_and_ties():
    # Ties pick the first maximum in window order; indices are flat positions in the plane.
    x = torch.tensor([[[[1.0, 3.0, 3.0, 0.0, 2.0],
                        [3.0, 1.0, 0.0, 2.0, 2.0],
                        [0.0, 0.0, 5.0, 5.0, 1.0],
                        [-1.0, 4.0, 5.0, 0.0, 7.0]]]])
    fn = lambda t: F.max_pool2d(t, 2, stride=2, padding=1, ceil_mode=True, return_indices=True)  # noqa: E731
    out, idx = assert_matches_eager(fn, x)
    assert idx.dtype == torch.int64
    torch.testing.assert_close(idx, fn(x)[1], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["max_pool2d", "max_pool2d_ceil_dilated", "max_pool3d"])
def test_max_pool_values_alone_are_reduce_windows(name, tmp_path):
    # With no reader of the indices (inference), a max pool is reduce_windows (on the CPU one per
    # spatial dim): equal to eager, NaN and -inf included, and with no gather of windows left.
    torch.manual_seed(0)
    make, shape = CASES[name]
    pool = make()
    x = torch.randn(shape)
    x.view(-1)[::7] = float("nan")
    x.view(-1)[3::11] = float("-inf")
    with torch.no_grad():
        text = _stablehlo(pool, x, tmp_path)
        torch.testing.assert_close(compile_tpu(pool)(x), pool(x), rtol=0, atol=0, equal_nan=True)
    assert "stablehlo.reduce_window" in text and "stablehlo.gather" not in text


def test_adaptive_avg_pool_exact_bins():
    # 7 -> 3 bins: [0,3), [2,5), [4,7); every output is the mean of its own bin.
    x = torch.arange(7.0).reshape(1, 1, 1, 7)
    out = assert_matches_eager(lambda t: F.adaptive_avg_pool2d(t, (1, 3)), x)
    torch.testing.assert_close(out.flatten(), torch.tensor([1.0, 3.0, 5.0]))


def test_adaptive_avg_pool_ignores_inf_outside_bin():
    x = torch.zeros(1, 1, 1, 6)
    x[..., 5] = float("inf")
    out = assert_matches_eager(lambda t: F.adaptive_avg_pool2d(t, (1, 4)), x)
    assert torch.isfinite(out[..., :3]).all()


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_forward_and_grads(mode, padding_mode, align_corners):
    torch.manual_seed(0)

    def fn(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)

    def run(f):
        x = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
        grid = (torch.rand(2, 4, 6, 2, generator=torch.Generator().manual_seed(2)) * 2.6 - 1.3).requires_grad_(True)
        out = f(x, grid)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        return out.detach(), x.grad, grid.grad

    assert_close_tree(run(compile_tpu(fn)), run(fn), rtol=1e-4, atol=5e-5)


def test_conv_bfloat16():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 8, 3, padding=1).to(torch.bfloat16)
    x = torch.randn(2, 4, 8, 8, dtype=torch.bfloat16)
    assert_matches_eager(conv, x, rtol=1.6e-2, atol=1e-2)


# --- dense convolutions on the CPU call ATen's kernel (kernels/aten_cpu.py) --------------------

NEEDS_CXX = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                               reason="no C++ compiler: the ATen kernels cannot be built, XLA's convolution is used")


def _stablehlo(fn, x, tmp_path, **options):
    with fresh_caches(tmp_path / "cache"):
        compile_tpu(fn, options={"dump_dir": str(tmp_path), **options})(x)
    return "\n".join(p.read_text() for p in tmp_path.glob("*.stablehlo.mlir"))


@NEEDS_CXX
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_convolution_calls_aten_and_matches_eager(tmp_path, dtype):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=(1, 2), dilation=(2, 1)).to(dtype)
    x = torch.randn(2, 3, 13, 11, dtype=dtype)
    text = _stablehlo(conv, x, tmp_path / "on")
    assert "torchtpu_aten_convolution" in text
    with torch.no_grad():
        out = compile_tpu(conv)(x)
        # the very kernel eager runs on a channels-last input: equal bits, except that bfloat16
        # rounds before the bias is added (eager's oneDNN adds it in float32), one bfloat16 step at most
        tol = dict(rtol=2 ** -7, atol=2 ** -7) if dtype == torch.bfloat16 else dict(rtol=0, atol=0)
        torch.testing.assert_close(out, conv.to(memory_format=torch.channels_last)(
            x.contiguous(memory_format=torch.channels_last)), **tol)
        # and eager's own layout within float tolerance
        torch.testing.assert_close(out, conv(x), **(tol if dtype == torch.bfloat16 else {}))


@NEEDS_CXX
def test_aten_kernels_off_and_grouped_split_and_backward(tmp_path):
    torch.manual_seed(0)
    grouped = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2)
    x = torch.randn(2, 8, 9, 9)
    assert "torchtpu_aten_convolution" not in _stablehlo(grouped, x, tmp_path / "off", aten_kernels="off")
    # a grouped 2d convolution is one channels-last ATen call on the CPU, float32 written into
    # XLA's own buffer ...
    text = _stablehlo(grouped, x, tmp_path / "on")
    assert text.count("torchtpu_aten_convolution_into(") == 1 and "torchtpu_aten_convolution(" not in text
    text = _stablehlo(copy.deepcopy(grouped).double(), x.double(), tmp_path / "on64")  # ... others copied there
    assert text.count("torchtpu_aten_convolution(") == 1 and "channels_last = 1" in text
    # ... a grouped 1d one is split into dense ones, each an ATen call in torch's own layout
    grouped1d = torch.nn.Conv1d(8, 8, 3, padding=1, groups=2)
    text = _stablehlo(grouped1d, torch.randn(2, 8, 9), tmp_path / "on1d")
    assert text.count("torchtpu_aten_convolution(") == 2 and "channels_last = 0" in text
    # training: the backward graph calls ATen's convolution_backward, and matches eager
    compiled = compile_tpu(grouped, options={"dump_dir": str(tmp_path / "train")})
    actual = _forward_and_grads(grouped, x, compiled)
    assert_close_tree(actual, _forward_and_grads(grouped, x, None))
    backward = "\n".join(p.read_text() for p in (tmp_path / "train").glob("backward*.stablehlo.mlir"))
    assert "torchtpu_aten_convolution_backward" in backward


@NEEDS_CXX
@pytest.mark.parametrize("batch", [1, 4])
def test_an_aten_kernel_that_throws_names_itself_in_xlas_error(batch):
    """What ATen raises inside the program comes back as XLA's error, naming the kernel and
    carrying ATen's own message, instead of a crash; also when it throws on XLA's pool threads
    (a batch of 4 runs in ranges there, where the machine has two cores or more)."""
    import jax
    import numpy as np

    from torchtpu.kernels import aten_cpu

    assert aten_cpu.available()
    call = jax.ffi.ffi_call(aten_cpu.TARGET, jax.ShapeDtypeStruct((batch, 4, 6, 6), np.float32))
    x, w = np.ones((batch, 3, 8, 8), np.float32), np.ones((4, 5, 3, 3), np.float32)  # 3 channels in, weights for 5
    ints = lambda *v: np.array(v, np.int64)  # noqa: E731
    with pytest.raises(Exception, match="torchtpu_aten_convolution: .*channels") as raised:
        jax.block_until_ready(call(x, w, stride=ints(1, 1), padding=ints(0, 0), dilation=ints(1, 1),
                                   groups=np.int64(1), channels_last=np.int64(0)))
    assert "Traceback" not in str(raised.value)


def test_exported_artifacts_never_call_aten():
    conv = torch.nn.Conv2d(3, 4, 3)
    exported = torchtpu.export(conv, torch.randn(1, 3, 8, 8), platforms=("cpu",))
    assert "stablehlo.convolution" in exported.stablehlo_text()
    assert "torchtpu_aten_convolution" not in exported.stablehlo_text()


def test_unbuildable_kernels_fall_back_to_xla_with_one_warning(monkeypatch, tmp_path, caplog):
    from torchtpu.kernels import aten_cpu

    monkeypatch.setenv("TORCHTPU_EXTENSION_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr(aten_cpu, "_state", {})
    with caplog.at_level("WARNING", logger="torchtpu.kernels"):
        assert not aten_cpu.available() and not aten_cpu.available()
    assert sum("unavailable" in r.message for r in caplog.records) == 1
    assert not list((tmp_path / "ext").glob("*.so"))  # nothing half-built left behind
    conv = torch.nn.Conv2d(3, 5, 2)
    x = torch.randn(1, 3, 7, 5)  # a shape no other test compiles: this compile is fresh
    with torch.no_grad():
        torch.testing.assert_close(compile_tpu(conv, options={"dump_dir": str(tmp_path / "d")})(x), conv(x))
    text = "\n".join(p.read_text() for p in (tmp_path / "d").glob("*.stablehlo.mlir"))
    assert "stablehlo.convolution" in text and "torchtpu_aten_convolution" not in text


def _eval_conv_bn(relu: bool, dtype=torch.float32):
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)] + ([torch.nn.ReLU()] if relu else [])
    model = torch.nn.Sequential(*layers).to(dtype).eval()
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2.0), bn.weight.normal_(), bn.bias.normal_()
    return model, torch.randn(2, 3, 10, 9, dtype=dtype)


def _dumped(tmp_path, suffix, prefix=""):
    return "\n".join(p.read_text() for p in tmp_path.glob(f"{prefix}*.{suffix}"))


@NEEDS_CXX
@pytest.mark.parametrize("relu", [True, False])
def test_eval_conv_batchnorm_relu_is_one_aten_call(tmp_path, relu):
    # An eval-mode BatchNorm (and ReLU) after a convolution is one fused node; on the CPU it is
    # folded into the convolution and oneDNN applies bias and ReLU as it writes.
    model, x = _eval_conv_bn(relu)
    with torch.no_grad():
        out = compile_tpu(model, options={"dump_dir": str(tmp_path / "on")})(x)
        torch.testing.assert_close(out, model(x))  # folding rounds differently: float tolerance
        fx, text = _dumped(tmp_path / "on", "fx.txt"), _dumped(tmp_path / "on", "stablehlo.mlir")
        assert "torchtpu.conv_bn" in fx and "batch_norm" not in fx and "relu.default" not in fx
        assert text.count("torchtpu_aten_convolution_into(") == 1 and f"relu = {int(relu)} " in text
        # without ATen's kernels the same node lowers as convolution, BatchNorm and ReLU
        off = compile_tpu(model, options={"aten_kernels": "off", "dump_dir": str(tmp_path / "off")})(x)
        torch.testing.assert_close(off, model(x))
        assert "torchtpu_aten" not in _dumped(tmp_path / "off", "stablehlo.mlir")


def test_conv_batchnorm_fusion_leaves_float64_exact_and_other_readers_alone(tmp_path):
    model, x = _eval_conv_bn(True, torch.float64)
    with torch.no_grad():  # float64 is fused but not folded: the ops as eager runs them
        out = compile_tpu(model, options={"dump_dir": str(tmp_path / "f64")})(x)
        torch.testing.assert_close(out, model(x), rtol=1e-12, atol=1e-12)
    assert "conv_bn" in _dumped(tmp_path / "f64", "fx.txt")

    class TwoReaders(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = _eval_conv_bn(False)[0]

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y), y

    two = TwoReaders().eval()
    x = torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        assert_close_tree(compile_tpu(two, options={"dump_dir": str(tmp_path / "two")})(x), two(x))
    assert "conv_bn" not in _dumped(tmp_path / "two", "fx.txt")
    train, x = _eval_conv_bn(True)
    compile_tpu(train.train(), options={"dump_dir": str(tmp_path / "train")})(x).sum().backward()
    assert "conv_bn" not in _dumped(tmp_path / "train", "fx.txt")  # batch statistics: not fused


@NEEDS_CXX
@pytest.mark.parametrize("channels, aten_gradients", [(31, True), (32, False)])
def test_wide_dense_convolutions_take_xlas_gradients(tmp_path, channels, aten_gradients):
    """A dense float32 or bfloat16 2d convolution's forward is ATen's kernel at any width
    (docs/DECISIONS.md 123); with 32 or more input channels its gradients are XLA's convolutions
    (DECISIONS 112, 113), and narrower ones and grouped ones keep ATen's backward."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(channels, 16, 3, padding=1)
    x = torch.randn(2, channels, 8, 8)
    compiled = compile_tpu(conv, options={"dump_dir": str(tmp_path / "train")})
    assert_close_tree(_forward_and_grads(conv, x, compiled), _forward_and_grads(conv, x, None))
    forward = _dumped(tmp_path / "train", "stablehlo.mlir", "forward")
    backward = _dumped(tmp_path / "train", "stablehlo.mlir", "backward")
    assert "torchtpu_aten_convolution" in forward and "stablehlo.convolution" not in forward
    assert ("torchtpu_aten_convolution_backward" in backward) is aten_gradients
    assert ("stablehlo.convolution" in backward) is not aten_gradients
    grouped = torch.nn.Conv2d(2 * channels, 16, 3, groups=2)
    assert "torchtpu_aten_convolution" in _stablehlo(grouped, torch.randn(2, 2 * channels, 8, 8), tmp_path / "g")
    half = copy.deepcopy(conv).bfloat16()
    assert "torchtpu_aten_convolution" in _stablehlo(half, x.bfloat16(), tmp_path / "bf16")
    # bfloat16 training, either kernel: about as far from float32 as eager bfloat16 is (on average;
    # the largest error is one element's rounding, which may fall either way)
    reference = _forward_and_grads(conv, x, None)
    eager = _forward_and_grads(half, x.bfloat16(), None)
    got = _forward_and_grads(half, x.bfloat16(), compile_tpu(half))
    for g, e, r in zip(*map(pytree.tree_leaves, (got, eager, reference))):
        g_err, e_err = (g.float() - r).abs(), (e.float() - r).abs()
        assert g_err.mean() <= 1.25 * e_err.mean() + 1e-5 and g_err.max() <= 2 * e_err.max() + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, kernel", [((2, 3, 16, 16), 8), ((2, 4, 9, 7), (4, 2)), ((2, 3, 10), 4),
                                           ((1, 2, 4, 6, 5), 2)])
def test_disjoint_patches_are_one_product_on_the_cpu(tmp_path, dtype, shape, kernel):
    """A convolution over disjoint patches (a ViT's or DiT's patch embedding: stride equal to the
    kernel, no padding) is a product on the CPU target, forward and backward, with no ATen call
    and no XLA convolution (docs/DECISIONS.md 113); what no patch covers (9 % 4, 7 % 2, 5 % 2)
    is left out as torch leaves it. The TPU target keeps XLA's convolution."""
    torch.manual_seed(0)
    conv = getattr(torch.nn, f"Conv{len(shape) - 2}d")(shape[1], 16, kernel, stride=kernel).to(dtype)
    x = torch.randn(shape, dtype=dtype)
    compiled = compile_tpu(conv, options={"dump_dir": str(tmp_path)})
    tol = dict(rtol=2 ** -7, atol=2 ** -6) if dtype == torch.bfloat16 else {}
    assert_close_tree(_forward_and_grads(conv, x, compiled), _forward_and_grads(conv, x, None), **tol)
    text = _dumped(tmp_path, "stablehlo.mlir")
    assert "stablehlo.dot_general" in text
    assert "convolution" not in text
    tpu = torchtpu.export(conv, x, platforms=("tpu",)).stablehlo_text()
    assert "stablehlo.convolution" in tpu and "dot_general" not in tpu


def _conv_bn_stack(dtype):
    torch.manual_seed(0)
    # (a bias right before a BatchNorm has a gradient of zero up to rounding: the first has none)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, padding=1))
    return model.to(dtype), torch.randn(4, 3, 12, 10).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_channel_sums_of_convolutions_read_rows_on_the_cpu(tmp_path, dtype):
    """BatchNorm's batch statistics of a convolution's result, their gradients and the
    convolution's bias gradient sum over N, H and W. On the CPU target a per-channel sum of a
    convolution's result (or its input gradient, through pointwise ops) is a batch of products
    with ones over the image rows, then a sum of the rows (docs/DECISIONS.md 115). Training
    matches eager: outputs, gradients and running statistics (float32 within its tolerance;
    bfloat16 within three times its own spread from float32). The TPU target keeps reductions."""
    model, x = _conv_bn_stack(dtype)
    eager_model = copy.deepcopy(model)
    compiled = compile_tpu(model, options={"dump_dir": str(tmp_path)})
    got = _forward_and_grads(model, x, compiled)
    eager = _forward_and_grads(eager_model, x, None)
    if dtype == torch.float32:
        assert_close_tree(got, eager)
    else:
        # bfloat16: a ReLU whose input rounds to the other side of zero flips a whole gradient
        # entry, so single entries of eager's and ours differ by as much as either differs from
        # float32 (this check's mean error against float32 read 1.4x eager's before these sums
        # changed, and 0.8x with another input). Each result stays within bfloat16's own spread
        # of eager's; a wrong sum is far outside it.
        reference_model, _ = _conv_bn_stack(torch.float32)
        reference = _forward_and_grads(reference_model, x.float(), None)
        for g, e, r in zip(*map(pytree.tree_leaves, (got, eager, reference))):
            assert (g.float() - e.float()).abs().mean() <= 3 * (e.float() - r).abs().mean() + 1e-5
    for name in ("1.running_mean", "1.running_var"):
        torch.testing.assert_close(model.get_buffer(name), eager_model.get_buffer(name),
                                   **({} if dtype == torch.float32 else dict(rtol=2 ** -7, atol=2 ** -7)))
    rows = "batching_dims = [0, 1] x [0, 2], contracting_dims = [2] x [3]"
    # forward: the BatchNorm's mean and variance; backward: its two sums of the gradient that the
    # middle convolution's backward made, and that convolution's bias gradient (the last one's
    # comes from the loss, a program input, and stays a reduction)
    counts = ["".join(f.read_text() for f in tmp_path.glob(f"{kind}_*.stablehlo.mlir")).count(rows)
              for kind in ("forward", "backward")]
    assert counts == [2, 3]
    tpu = torchtpu.export(model, x, platforms=("tpu",)).stablehlo_text()
    assert "stablehlo.reduce" in tpu and "batching_dims = [0, 1] x [0, 2]" not in tpu


def test_per_channel_sums_keep_torchs_accuracy():
    """A large batch with a mean far from zero: the batch mean and variance of a convolution's
    result (read back as the running statistics after one step) are as accurate against float64
    as eager's. A single product over all 131072 rows lost two digits (relative error 1.3e-5
    against torch's 2.4e-7); the rows are summed one image row at a time instead."""
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16, momentum=1.0)
    with torch.no_grad():
        conv.bias.fill_(5.0)
    model = torch.nn.Sequential(conv, bn)
    eager_model = copy.deepcopy(model)
    x = torch.randn(32, 3, 64, 64)
    compile_tpu(model)(x)
    eager_model(x)
    y = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
    mean, var = y.mean((0, 2, 3)), y.var((0, 2, 3))  # momentum 1: the running stats are these
    for name, want in (("running_mean", mean), ("running_var", var)):
        got, eager = model.get_buffer(f"1.{name}").double(), eager_model.get_buffer(f"1.{name}").double()
        err, eager_err = ((got - want).abs() / want.abs()).max(), ((eager - want).abs() / want.abs()).max()
        assert err <= 4 * eager_err + 1e-7, (name, err, eager_err)


def test_per_channel_sum_of_a_program_input_stays_a_reduction(tmp_path):
    """An array that no convolution produced keeps its row-major layout, and its per-channel
    sum stays XLA's reduction (a product would first transpose it)."""
    x = torch.randn(4, 8, 6, 5)
    text = _stablehlo(lambda t: t.sum((0, 2, 3)), x, tmp_path)
    assert "stablehlo.reduce" in text and "dot_general" not in text
