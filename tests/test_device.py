"""The eager tpu device (torchtpu.device): registration, the device module, storages and views,
one program per op, transfers, errors, autograd and optimizer steps against the CPU."""
from __future__ import annotations

import copy
import os

import pytest
import torch

import helpers
import torchtpu
import torchtpu.device
from torchtpu.device import module as tpu_module
from torchtpu.device.strict import NoDeviceKernel

TPU = "tpu"


def _count(name: str) -> int:
    return torchtpu.stats().get(name, 0)


def _same(device_tensor: torch.Tensor, expected: torch.Tensor, atol: float = 0.0):
    assert device_tensor.device.type == TPU
    got = device_tensor.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=atol, rtol=0 if atol == 0 else 1.3e-6)


# --- the target program, registration, the device module ----------------------------------------


def test_target_program_prints_like_torch():
    x, y = torch.randn(2, 2, device=TPU), torch.randn(2, 2, device=TPU)
    z = x @ y
    assert str(z.device) == "tpu:0"
    expected = x.cpu() @ y.cpu()
    torch.testing.assert_close(z.cpu(), expected)
    assert str(z) == str(expected)[:-1] + ", device='tpu:0')"
    assert repr(torch.tensor(3.5, device=TPU)) == "tensor(3.5000, device='tpu:0')"


def test_import_loads_jax_only_when_a_tensor_is_made():
    script = (
        "import sys, torch, torchtpu.device\n"
        "assert 'jax' not in sys.modules, 'import'\n"
        "assert torch.tpu.device_count() == 1 and torch.accelerator.device_count() == 1\n"
        "torch.tpu.is_available(); torch.empty(3, device='tpu'); torch.manual_seed(0)\n"
        "assert 'jax' not in sys.modules, 'empty'\n"
        "x = torch.ones(3, device='tpu')\n"
        "assert 'jax' in sys.modules\n"
        "print(x.sum().item())\n"
    )
    assert helpers.run_python(script).strip() == "3.0"


def test_registration_is_idempotent_and_torch_knows_the_device():
    torchtpu.device.register()
    torchtpu.device.register()
    assert torch._C._get_privateuse1_backend_name() == TPU
    assert torch.tpu is tpu_module
    assert torch.device("tpu").type == TPU
    t = torch.ones(2).tpu()
    assert t.is_tpu and t.device == torch.device("tpu:0")
    assert torch.accelerator.current_accelerator().type == TPU
    assert torch.accelerator.current_device_index() == 0


def test_is_available_only_with_a_real_tpu_or_when_asked(monkeypatch):
    monkeypatch.setenv("TORCHTPU_DEVICE_AVAILABLE", "1")
    assert torch.tpu.is_available() and torch.accelerator.is_available()
    monkeypatch.setenv("TORCHTPU_DEVICE_AVAILABLE", "0")
    assert not torch.tpu.is_available() and not torch.accelerator.is_available()
    monkeypatch.delenv("TORCHTPU_DEVICE_AVAILABLE")
    real_tpu = tpu_module.platform_name() == "tpu"
    assert torch.tpu.is_available() == real_tpu == torch.accelerator.is_available()
    assert torch.tpu.device_count() == 1  # tensors work either way
    assert torch.ones(1, device=TPU).item() == 1.0


def test_device_module_answers():
    m = torch.tpu
    assert m.device_count() == 1 and m.current_device() == 0
    m.set_device(0)
    with pytest.raises(RuntimeError, match="invalid device index"):
        m.set_device(1)
    with m.device("tpu:0"):
        pass
    props = m.get_device_properties()
    word = {"tpu": "TPU", "gpu": "GPU", "cpu": "CPU emulation"}[props.platform]
    assert word in m.get_device_name() and props.emulated == (props.platform != "tpu")
    free, total = m.mem_get_info()
    assert 0 < free <= total == props.total_memory
    assert m.is_bf16_supported() and m.get_device_capability() == (0, 0)
    m.synchronize()
    m.empty_cache()


def test_memory_stats_count_live_storages():
    m = torch.tpu
    before = m.memory_allocated()
    x = torch.empty(1000, device=TPU)
    assert m.memory_allocated() == before + 4000
    assert m.max_memory_allocated() >= before + 4000
    del x
    assert m.memory_allocated() == before
    m.reset_peak_memory_stats()
    assert m.max_memory_allocated() == before


def test_seeds_and_rng_state_reproduce():
    torch.manual_seed(123)  # reaches torch.tpu.manual_seed_all
    a = torch.randn(8, device=TPU).cpu()
    torch.manual_seed(123)
    assert torch.equal(torch.randn(8, device=TPU).cpu(), a)
    state = torch.tpu.get_rng_state()
    b = torch.rand(8, device=TPU).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(8, device=TPU).cpu(), b)
    assert not torch.equal(torch.rand(8, device=TPU).cpu(), b)


# --- factories and transfers ---------------------------------------------------------------------


def test_factories_match_torch():
    _same(torch.zeros(2, 3, device=TPU), torch.zeros(2, 3))
    _same(torch.ones(4, dtype=torch.bfloat16, device=TPU), torch.ones(4, dtype=torch.bfloat16))
    _same(torch.full((2, 2), 3.5, device=TPU), torch.full((2, 2), 3.5))
    _same(torch.full((2,), 7, device=TPU), torch.full((2,), 7))  # int64, as torch infers
    _same(torch.arange(5, device=TPU), torch.arange(5))
    _same(torch.arange(1.0, 2.0, 0.25, device=TPU), torch.arange(1.0, 2.0, 0.25))
    _same(torch.tensor([[1, 2], [3, 4]], device=TPU), torch.tensor([[1, 2], [3, 4]]))
    base = torch.randn(3, 2, device=TPU)
    _same(torch.zeros_like(base), torch.zeros(3, 2))
    _same(torch.ones_like(base, dtype=torch.int32), torch.ones(3, 2, dtype=torch.int32))
    _same(torch.full_like(base, 2.0), torch.full((3, 2), 2.0))
    assert torch.empty(3, 4, device=TPU).shape == (3, 4)
    assert torch.empty_like(base).shape == (3, 2)
    u = torch.rand(1000, device=TPU).cpu()
    assert 0 <= u.min() and u.max() < 1 and 0.4 < u.mean() < 0.6
    n = torch.randn(1000, device=TPU).cpu()
    assert abs(n.mean()) < 0.2 and 0.8 < n.std() < 1.2
    r = torch.randint(3, 7, (1000,), device=TPU).cpu()
    assert r.dtype == torch.int64 and r.min() == 3 and r.max() == 6
    assert torch.rand_like(base).shape == (3, 2) and torch.randn_like(base).dtype == torch.float32


def test_clones_and_casts_do_not_read_the_empty_destination():
    host = torch.randn(3, 4)
    dev = host.to(TPU)
    uploads = _count("eager_uploads")
    c = dev.clone()  # shares the immutable array until either side is written
    c.add_(dev)
    _same(dev, host)
    _same(c, host * 2)
    _same(dev.t().contiguous(), host.t().contiguous())
    _same(dev.to(torch.bfloat16), host.to(torch.bfloat16))
    _same(torch.zeros_like(dev), torch.zeros(3, 4))
    assert _count("eager_uploads") == uploads  # no zeros uploaded for torch.empty_like's storage


def test_transfers_copy_values_both_ways():
    host = torch.arange(6.0).view(2, 3)
    dev = host.to(TPU)
    host.add_(100)  # the device copy does not follow later host writes
    back = dev.cpu()
    assert torch.equal(back, torch.arange(6.0).view(2, 3))
    back.add_(1)  # nor does the device value follow writes to a downloaded copy
    assert torch.equal(dev.cpu(), torch.arange(6.0).view(2, 3))
    assert dev[1, 2].item() == 5.0 and isinstance(dev.sum().item(), float)
    assert dev.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert dev.cpu().numpy().sum() == 15.0
    assert torch.equal(dev.t().cpu(), torch.arange(6.0).view(2, 3).t())  # a view reads through its strides
    assert torch.equal(dev.to(torch.int64).cpu(), torch.arange(6).view(2, 3))


def test_module_to_tpu_and_back():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    model.to(TPU)
    assert all(p.device.type == TPU for p in model.parameters())
    x = torch.randn(2, 3)
    with torch.no_grad():
        out = model(x.to(TPU)).cpu()
    model.cpu()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    torch.testing.assert_close(out, model(x).detach(), atol=1e-6, rtol=1e-5)


# --- storage and views -------------------------------------------------------------------------


def _pair():
    base = torch.arange(12.0).view(3, 4)
    return base.to(TPU), base


def test_write_through_a_slice_reaches_the_base():
    dev, host = _pair()
    dev[1:, 2] = 5.0
    host[1:, 2] = 5.0
    dev[0].add_(1)
    host[0].add_(1)
    _same(dev, host)


def test_base_write_reaches_views():
    dev, host = _pair()
    col, flat, row = dev[:, 1], dev.view(12), dev.select(0, 2)
    dev.mul_(2)
    host.mul_(2)
    _same(col, host[:, 1])
    _same(flat, host.view(12))
    _same(row, host.select(0, 2))
    assert col._base is dev and col.data_ptr() == dev.data_ptr() + 4


def test_expand_then_clone_and_transposed_in_place():
    dev, host = _pair()
    _same(dev[0:1].expand(3, 4).clone(), host[0:1].expand(3, 4).clone())
    t = dev.t()
    assert t.stride() == (1, 4) and not t.is_contiguous()
    t.mul_(10)
    t[0].fill_(-1)
    h = host.t()
    h.mul_(10)
    h[0].fill_(-1)
    _same(dev, host)
    _same(t.contiguous(), h.contiguous())


def test_views_share_storage_with_torch_semantics():
    dev, host = _pair()
    views = {
        "reshape": (lambda x: x.reshape(2, 6)), "permute": (lambda x: x.view(3, 2, 2).permute(2, 0, 1)),
        "unsqueeze": (lambda x: x.unsqueeze(1).squeeze(1)), "slice": (lambda x: x[:, 1:3]),
        "as_strided": (lambda x: x.as_strided((2, 2), (1, 4), 1)), "expand": (lambda x: x[:1].expand(2, 4)),
        "transpose": (lambda x: x.transpose(0, 1)), "unfold": (lambda x: x.view(12).unfold(0, 4, 2)),
        "narrow": (lambda x: x.narrow(1, 1, 2)), "diagonal": (lambda x: x.diagonal()),
    }
    for name, fn in views.items():
        v, w = fn(dev), fn(host)
        assert v.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr(), name
        assert (v.shape, v.stride(), v.storage_offset()) == (w.shape, w.stride(), w.storage_offset()), name
        _same(v + 0, w + 0)
    other = torch.zeros(3, 4, device=TPU)
    assert other.untyped_storage().data_ptr() != dev.untyped_storage().data_ptr()
    non_viewable = dev.t().reshape(12)  # not a view: a copy, as in torch
    non_viewable.add_(1000)
    _same(dev, host)


def test_version_counters_and_autograd_see_in_place_writes():
    x = torch.ones(3, device=TPU)
    v = x._version
    x.add_(1)
    x[0] = 3.0
    assert x._version >= v + 2
    w = torch.ones(3, device=TPU, requires_grad=True)
    y = w * 2
    saved = y.sin()
    y.add_(1)  # sin saved y for its backward: torch's own check fires
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def test_conjugate_and_negative_views_are_values():
    """conj() on tpu gives the conjugate values (no conjugate bit: torch's C++ resolves that bit
    by reading memory, which crashed the process for this device)."""
    x = torch.randn(4)
    z = torch.complex(x, 2 * x)
    dz = z.to(TPU)
    _same(dz.conj() + 1, z.conj() + 1)
    _same(dz.conj().clone(), z.conj().resolve_conj())
    assert not dz.conj().is_conj()
    w = torch.randn(5, 6, 7)
    _same(torch.fft.hfft(w.to(TPU), n=10, dim=1, norm="ortho"), torch.fft.hfft(w, n=10, dim=1, norm="ortho"),
          atol=1e-5)
    _same(torch._neg_view(x.to(TPU)) * 1, -x)
    pairs = torch.randn(3, 2)  # view_as_complex/view_as_real: one storage read as two dtypes
    dc = torch.view_as_complex(pairs.to(TPU))
    _same(dc * 2, torch.view_as_complex(pairs) * 2)
    real = torch.view_as_real(dc)
    real[0, 1] = 100.0  # a write through the float view reaches the complex tensor
    expected = torch.view_as_complex(pairs.clone())
    torch.view_as_real(expected)[0, 1] = 100.0
    _same(dc, expected)


def test_zero_size_and_scalars():
    e = torch.zeros(0, 3, device=TPU)
    _same(e + 1, torch.zeros(0, 3) + 1)
    s = torch.tensor(2.0, device=TPU)
    _same(s * s + 1, torch.tensor(5.0))
    _same(torch.ones(3, device=TPU) * torch.tensor(4.0), torch.full((3,), 4.0))  # a 0-d CPU tensor


# --- programs, errors --------------------------------------------------------------------------


def test_a_second_identical_op_compiles_nothing():
    a, b = torch.randn(16, device=TPU), torch.randn(16, device=TPU)
    (a - b).cpu()
    programs, compiles, hits = _count("eager_programs"), _count("xla_compiles"), _count("eager_hits")
    c = torch.randn(16, device=TPU)
    (c - b).cpu()
    assert _count("eager_programs") == programs and _count("xla_compiles") == compiles
    assert _count("eager_hits") >= hits + 1


def test_changing_python_numbers_compile_nothing():
    x = torch.randn(8, device=TPU)
    y = torch.randn(8, device=TPU)
    x.mul(0.5), x.add(y, alpha=0.1), x.addcdiv(x, y.abs() + 1, value=0.2), x + 3
    programs = _count("eager_programs")
    for lr in (0.25, 1e-3, -7.0):
        _same(x.mul(lr), x.cpu().mul(lr))
        _same(x.add(y, alpha=lr), x.cpu().add(y.cpu(), alpha=lr), atol=1e-6)
        _same(x.addcdiv(x, y.abs() + 1, value=lr), x.cpu().addcdiv(x.cpu(), y.cpu().abs() + 1, value=lr), atol=1e-6)
        _same(x + int(lr * 4), x.cpu() + int(lr * 4))
    assert _count("eager_programs") == programs


def test_constants_keep_signed_zero_and_nan():
    assert torch.signbit(torch.full((2,), -0.0, device=TPU).cpu()).all()
    assert not torch.signbit(torch.full((2,), 0.0, device=TPU).cpu()).any()
    torch.full((2,), float("nan"), device=TPU)
    programs = _count("eager_programs")
    assert torch.full((2,), float("nan"), device=TPU).cpu().isnan().all()  # a new NaN object: same program
    assert _count("eager_programs") == programs


def test_wrapped_numbers_keep_torch_promotion():
    h = torch.tensor(1.5, dtype=torch.bfloat16)
    _same(h.to(TPU) * 0.5, h * 0.5)  # a 0-d bfloat16 stays bfloat16
    i = torch.arange(4, dtype=torch.int32)
    _same(i.to(TPU) + 3, i + 3)
    _same(i.to(TPU) * 0.5, i * 0.5)
    _same(torch.ones(2, dtype=torch.bool).to(TPU) + 1, torch.ones(2, dtype=torch.bool) + 1)
    # ops that refuse a Python number for a Tensor argument get it as a 0-d input instead
    x = torch.randn(3, 4)
    _same(torch.remainder(x.to(TPU), 0.7), torch.remainder(x, 0.7), atol=1e-6)
    programs = _count("eager_programs")
    _same(torch.remainder(x.to(TPU), 0.3), torch.remainder(x, 0.3), atol=1e-6)
    assert _count("eager_programs") == programs
    index = torch.randint(0, 4, (3, 2))
    _same(torch.take_along_dim(x.to(TPU), index.to(TPU), 1), torch.take_along_dim(x, index, 1))


def test_mixed_devices_raise_torchs_error():
    x = torch.ones(2, 2, device=TPU)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(2, 2)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.mul_(torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(x, torch.ones(2, 2))
    _same(x * torch.tensor(3.0), torch.full((2, 2), 3.0))
    _same(x[torch.tensor([1, 0])], torch.ones(2, 2))  # CPU indices are accepted, as torch does


@torch.library.custom_op("torchtpu_test::device_no_rule", mutates_args=(), device_types="cpu")
def _no_rule(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@_no_rule.register_fake
def _(x):
    return torch.empty_like(x)


def test_op_without_a_rule_names_the_op():
    x = torch.ones(3, device=TPU)
    with pytest.raises(NoDeviceKernel, match=r"torchtpu_test\.device_no_rule\.default cannot run on the tpu "
                                             r"device: no lowering for torchtpu_test\.device_no_rule"):
        _no_rule(x)
    assert issubclass(NoDeviceKernel, NotImplementedError)


def test_host_only_ops_run_on_a_copy():
    host = torch.tensor([[1.0, -2.0], [0.0, 4.0]])
    dev = host.to(TPU)
    before = _count("eager_host_ops")
    _same(dev[dev > 0], host[host > 0])
    _same(dev.nonzero(), host.nonzero())
    assert torch.equal(dev, dev) and not torch.equal(dev, dev + 1)
    out = torch.empty(0, dtype=torch.int64, device=TPU)
    torch.nonzero(dev, out=out)  # an out= the host op resizes
    _same(out, host.nonzero())
    assert _count("eager_host_ops") >= before + 4


# --- autograd and training ---------------------------------------------------------------------


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_conv_net_forward_backward_and_scans_match_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    dev = copy.deepcopy(cpu).to(TPU)
    x = torch.randn(2, 3, 8, 8)
    expected, got = cpu(x), dev(x.to(TPU))
    torch.testing.assert_close(got.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    expected.square().sum().backward()
    got.square().sum().backward()
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-5)
    v = torch.randn(7)
    values, indices = v.to(TPU).cummax(0)
    _same(values, v.cummax(0).values)
    _same(indices, v.cummax(0).indices)
    _same(torch.quantile(v.to(TPU), 0.3), torch.quantile(v, 0.3), atol=1e-6)  # as_strided_ stays metadata
    up = torch.nn.functional.interpolate  # eager reaches upsample_bilinear2d.default, not .vec
    _same(up(x.to(TPU), scale_factor=2, mode="bilinear"), up(x, scale_factor=2, mode="bilinear"), atol=1e-5)


def test_group_norm_of_a_channels_last_input_matches_cpu():
    """torch's math composite of native_group_norm (what a backend without its own kernel gets)
    views the input as contiguous: a channels-last input (diffusers' attention blocks make one)
    failed with a view error. It runs as one program instead."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 4, 16).permute(0, 3, 1, 2)
    cpu = torch.nn.GroupNorm(4, 16)
    dev = copy.deepcopy(cpu).to(TPU)
    xc, xd = x.clone().requires_grad_(), x.to(TPU).requires_grad_()
    assert xd.stride() == xc.stride() and not xd.is_contiguous()
    expected, got = cpu(xc), dev(xd)
    torch.testing.assert_close(got.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    expected.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-5)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-5)

def test_linear_forward_backward_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(5, 3)
    dev = copy.deepcopy(cpu).to(TPU)
    x = torch.randn(7, 5)
    cpu(x).tanh().sum().backward()
    dev(x.to(TPU)).tanh().sum().backward()
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-5)


def test_backward_formulas_with_a_zero_tensor_and_an_index_put():
    x = torch.randn(3, 4)
    t = x.to(TPU).requires_grad_()
    (g,) = torch.autograd.grad(t.sgn().sum() + t[[0, 2, 0]].square().sum(), t)  # sgn: an _efficientzerotensor
    _same(g, torch.zeros(3, 4).index_put_((torch.tensor([0, 2, 0]),), 2 * x[[0, 2, 0]], accumulate=True),
          atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_slice_and_select_backward_are_one_op_each(dtype, monkeypatch):
    """torch's composite for them is zeros + a copy_ into a view: two programs per backward."""
    from torchtpu.device import strict

    ran = []
    run = strict.run
    monkeypatch.setattr(strict, "run", lambda op, args, kwargs: (ran.append(str(op)), run(op, args, kwargs))[1])
    x = torch.randn(4, 6, 5).to(dtype)
    t = x.to(TPU).requires_grad_()
    loss = lambda v: (v[:, 1:5:2, -3:] * 2).sum() + (v[2, :, 1] * 3).sum() + v[..., :2].sum()  # noqa: E731
    (expected,) = torch.autograd.grad(loss(x.requires_grad_()), x)
    (g,) = torch.autograd.grad(loss(t), t)
    _same(g, expected)
    assert ran.count("aten.slice_backward.default") == 3 and ran.count("aten.select_backward.default") == 2
    assert "aten.zeros.default" not in ran and "aten.copy_.default" not in ran, ran


@pytest.mark.parametrize("foreach", [None, False])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_mlp_training_steps_match_cpu(optimizer, foreach):
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=foreach),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=foreach)}[optimizer]
    torch.manual_seed(0)
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    models = [(cpu, make(cpu.parameters())), (dev, make(dev.parameters()))]
    for m, opt in models:
        opt.param_groups[0]["lr_schedule"] = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    losses = {}
    for step in range(4):
        if step == 2:
            programs = _count("eager_programs")
        for m, opt in models:
            on = next(m.parameters()).device
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x.to(on)), y.to(on))
            loss.backward()
            opt.step()
            opt.param_groups[0]["lr_schedule"].step()  # a new learning rate every step
            losses.setdefault(on.type, []).append(loss.item())
    assert _count("eager_programs") == programs  # steps 3 and 4: no new program
    torch.testing.assert_close(losses[TPU], losses["cpu"], atol=1e-5, rtol=1e-5)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-5)


class _ForeachCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch._foreach_* calls on tpu tensor lists."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name.startswith("_foreach_") and any(isinstance(a, (list, tuple)) and a and
                                               isinstance(a[0], torch.Tensor) and a[0].device.type == TPU
                                               for a in args):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("optimizer", ["adamw", "adam_amsgrad", "sgd"])
def test_a_foreach_optimizer_step_is_one_device_op_per_foreach_call(mode, optimizer):
    from torchtpu.device import defer

    make = {"adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
            "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True, weight_decay=0.01),
            "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)}[optimizer]
    torch.manual_seed(0)
    cpu = _mlp()
    dev = copy.deepcopy(cpu).to(TPU)
    opts = [make(cpu.parameters()), make(dev.parameters())]
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    with torchtpu.eager_mode(mode):
        for step in range(5):
            if step == 3:  # defer: step 2's graph is the first without the state's creation
                programs = (_count("eager_programs"), _count("defer_programs"), _count("xla_compiles"))
            for m, opt in zip((cpu, dev), opts):
                on = next(m.parameters()).device
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x.to(on)), y.to(on)).backward()
                if on.type != TPU:
                    opt.step()
                    continue
                torchtpu.sync()
                before = _count("eager_programs") + _count("eager_hits") + defer.pending_ops()
                with _ForeachCalls() as calls:
                    opt.step()
                ops = _count("eager_programs") + _count("eager_hits") + defer.pending_ops() - before
                if step:  # (the first step also makes the optimizer's state: zeros_like per tensor)
                    assert calls.calls >= 3 and ops == calls.calls  # one device op per foreach call
            for opt in opts:
                opt.param_groups[0]["lr"] *= 0.7  # a new learning rate every step: no new program
        assert (_count("eager_programs"), _count("defer_programs"), _count("xla_compiles")) == programs
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-5)


def test_deepcopy_dtype_views_and_accumulating_index_put():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(TPU)
    twin = copy.deepcopy(model)  # torch clones storages: a tpu storage's clone shares its array
    with torch.no_grad():
        twin.weight.add_(1)
    torch.testing.assert_close(twin.weight.cpu(), model.weight.cpu() + 1)
    x = torch.tensor([1.0, -2.0, 0.5])
    _same(x.to(TPU).view(torch.int32) + 1, x.view(torch.int32) + 1)
    acc = torch.zeros(3, device=TPU).index_put_((torch.tensor([0, 0, 2], device=TPU),), torch.ones(3, device=TPU),
                                                accumulate=True)
    _same(acc, torch.tensor([2.0, 0.0, 1.0]))
    with pytest.raises(IndexError, match="out of bounds"):
        torch.ones(3, device=TPU)[torch.tensor([5], device=TPU)].cpu()


def test_tiny_llama_forward_matches_cpu():
    from benchmarks.models import hf_llama

    torch.manual_seed(0)
    model = hf_llama()
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        expected = model(ids).logits
        model.to(TPU)
        logits = model(ids.to(TPU)).logits
    assert logits.device.type == TPU
    torch.testing.assert_close(logits.cpu(), expected, atol=1e-4, rtol=1e-4)


def test_trainer_stays_on_the_cpu_without_a_tpu():
    """transformers picks the accelerator by torch.accelerator.is_available(): with no TPU attached
    the default is the CPU; TORCHTPU_DEVICE_AVAILABLE=1 opts in to the emulated device."""
    from transformers import TrainingArguments

    if tpu_module.platform_name() == "tpu":
        pytest.skip("a real TPU is attached")
    assert TrainingArguments(output_dir="unused", report_to=[]).device.type == "cpu"
    script = ("import torch, torchtpu.device\n"
              "from transformers import TrainingArguments\n"
              "print(TrainingArguments(output_dir='unused', report_to=[]).device)\n")
    env = dict(os.environ, TORCHTPU_DEVICE_AVAILABLE="1")
    assert helpers.run_python(script, env).strip().splitlines()[-1] == "tpu:0"


def test_compiled_graphs_take_and_return_device_arrays():
    """torch.compile(backend="tpu") on tpu tensors: parameters and inputs go in as their storages'
    arrays, results come back as tpu tensors over the program's arrays; no host copy."""
    from helpers import compile_tpu

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    dev = copy.deepcopy(cpu).to(TPU)
    compiled = compile_tpu(dev)
    x = torch.randn(5, 8)
    xd = x.to(TPU)
    compiled(xd)
    moved = _count("eager_uploads") + _count("eager_downloads")
    out = compiled(xd)
    assert out.device.type == TPU and _count("eager_uploads") + _count("eager_downloads") == moved
    torch.testing.assert_close(out.cpu(), cpu(x).detach(), atol=1e-5, rtol=1e-5)
    compiled(xd).square().mean().backward()
    cpu(x).square().mean().backward()
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-5)
    for m in (dev, cpu):  # a write through .data bumps no version counter: the graph still sees it
        m[0].weight.data.copy_(m[0].weight.data * 2)
    torch.testing.assert_close(compiled(xd).cpu(), cpu(x).detach(), atol=1e-5, rtol=1e-5)


def test_programs_with_lapack_calls_load_from_a_warm_disk_cache(tmp_path):
    """A program calling LAPACK (logdet) loaded from the disk cache in a fresh process: jaxlib had
    not set up its LAPACK kernels yet and the call crashed the process."""
    script = ("import torch, torchtpu, torchtpu.device\n"
              "x = torch.tensor([[1.5, 0.2], [0.1, 2.0]])\n"
              "print(torch.logdet(x.to('tpu')).item(), torchtpu.stats().get('disk_hits', 0))\n")
    env = dict(os.environ, TORCHTPU_CACHE_DIR=str(tmp_path / "cache"))
    runs = [helpers.run_python(script, env) for _ in range(2)]
    (value, cold_hits), (again, warm_hits) = (map(float, r.split()) for r in runs)
    assert value == again == pytest.approx(torch.logdet(torch.tensor([[1.5, 0.2], [0.1, 2.0]])).item())
    assert cold_hits == 0 and warm_hits >= 1
