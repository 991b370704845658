"""`torch.autocast("tpu", dtype=torch.bfloat16)` on the eager device (torchtpu/device/autocast.py):
each list's dtype rule, against the CPU's autocast where both cast alike, and a training step."""
from __future__ import annotations

import copy

import pytest
import torch

import torchtpu.device  # noqa: F401  (the device)

TPU = "tpu"
BF16 = torch.bfloat16


def _pair(*shape, seed=0):
    torch.manual_seed(seed)
    cpu = torch.randn(*shape)
    return cpu, cpu.to(TPU)


def test_matmuls_and_convolutions_run_in_the_autocast_dtype_as_on_the_cpu():
    (a, ta), (b, tb) = _pair(8, 16), _pair(16, 4, seed=1)
    (x, tx), (w, tw) = _pair(2, 3, 8, 8, seed=2), _pair(5, 3, 3, 3, seed=3)
    with torch.autocast("tpu", dtype=BF16):
        got = [ta @ tb, torch.nn.functional.linear(ta, tb.t()), torch.nn.functional.conv2d(tx, tw)]
    with torch.autocast("cpu", dtype=BF16):
        expected = [a @ b, torch.nn.functional.linear(a, b.t()), torch.nn.functional.conv2d(x, w)]
    for g, e in zip(got, expected):
        assert g.device.type == TPU and g.dtype == BF16 == e.dtype
        torch.testing.assert_close(g.cpu(), e, atol=2e-2, rtol=1e-2)


def test_float32_ops_and_promotion_follow_the_accelerator_rules():
    (a, ta) = _pair(4, 8)
    low = ta.to(BF16)
    with torch.autocast("tpu", dtype=BF16):
        exp, soft, norm = torch.exp(low), torch.softmax(low, -1), torch.nn.functional.layer_norm(low, (8,))
        cat = torch.cat([low, ta])
        kept = low + low  # not on any list: its own dtype
    assert (exp.dtype, soft.dtype, norm.dtype, cat.dtype, kept.dtype) == (torch.float32,) * 4 + (BF16,)
    torch.testing.assert_close(exp.cpu(), torch.exp(a.to(BF16).float()))
    torch.testing.assert_close(cat.cpu(), torch.cat([a.to(BF16).float(), a]))


def test_outside_the_region_nothing_is_cast():
    (_, ta), (_, tb) = _pair(4, 4), _pair(4, 4, seed=1)
    with torch.autocast("tpu", dtype=BF16):
        assert (ta @ tb).dtype == BF16
        with torch.autocast("tpu", enabled=False):
            assert (ta @ tb).dtype == torch.float32
    assert (ta @ tb).dtype == torch.float32
    with torch.autocast("cpu", dtype=BF16):  # the CPU's region does not reach tpu tensors
        assert (ta @ tb).dtype == torch.float32


def test_a_training_step_under_autocast_matches_the_cpus():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 4))
    tpu = copy.deepcopy(cpu).to(TPU)
    x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
    losses = {}
    for name, model, device in (("cpu", cpu, "cpu"), ("tpu", tpu, TPU)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            with torch.autocast(device, dtype=BF16):
                out = model(x.to(device))
                loss = torch.nn.functional.cross_entropy(out, target.to(device))
            assert out.dtype == BF16 and loss.dtype == torch.float32
            opt.zero_grad()
            loss.backward()
            assert all(p.grad.dtype == torch.float32 for p in model.parameters())
            opt.step()
        losses[name] = loss.item()
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=2e-2)
    for p_tpu, p_cpu in zip(tpu.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_tpu.detach().cpu(), p_cpu.detach(), atol=2e-2, rtol=2e-2)
