"""sin and cos on the CPU target (compiler/rules/trig.py, docs/DECISIONS.md 112): the
vectorizable form is correctly rounded where it applies, and every other input keeps XLA's op."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torchtpu
from torchtpu.compiler.rules import trig

from helpers import compile_tpu


def _ulp_error(got, x, fn):
    exact = fn(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    return np.max(np.abs(np.asarray(got, np.float64) - exact) / ulp)


@pytest.mark.parametrize("limit", [1e-3, 1.0, 4.0, 300.0, 3e4, trig.REDUCE_BOUND])
def test_reduced_form_is_correctly_rounded(limit):
    rng = np.random.default_rng(0)
    x = rng.uniform(-limit, limit, 1 << 16).astype(np.float32)
    # and the values nearest the multiples of pi/2, where the reduction cancels most
    # (not 0's neighbour: XLA:CPU flushes subnormals in all its float arithmetic)
    k = np.array([-40, -17, -3, -2, -1, 1, 2, 3, 17, 40]) if limit > 64 else np.array([-1, 1])
    x = np.concatenate([x, np.nextafter((k * np.pi / 2).astype(np.float32), np.float32(np.inf))])
    with jax.enable_x64(True):
        sin = jax.jit(lambda v: trig._reduced(v, cos=False))(x)
        cos = jax.jit(lambda v: trig._reduced(v, cos=True))(x)
    # measured 0.50 (correct rounding); torch's own kernel is 0.60 ulp on the same inputs
    assert _ulp_error(sin, x, np.sin) <= 0.51
    assert _ulp_error(cos, x, np.cos) <= 0.51


def test_compiled_sin_cos_match_eager_on_every_input():
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 0.5, -2.0, np.pi / 2, 1e3, -7e4, 5e5])
    big = torch.tensor([0.0, 1.0, 3e6, -1e20, 3.4e38, float("inf"), float("-inf"), float("nan")])
    fn = lambda v: (torch.sin(v), torch.cos(v), v.sin() * v.cos())  # noqa: E731
    for values in (x, big):
        actual, expected = compile_tpu(fn)(values.clone()), fn(values.clone())
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=2.4e-7, atol=0, equal_nan=True)
            assert torch.equal(a.signbit(), e.signbit()) or bool(e.isnan().any())
    # signed zeros: sin(-0) is -0; and an empty tensor has no largest magnitude
    assert compile_tpu(torch.sin)(torch.tensor([-0.0])).signbit().item()
    assert compile_tpu(torch.cos)(torch.zeros(0, 3)).shape == (0, 3)


def test_rotary_table_bfloat16_and_gradient():
    """What models use: a rotary table from positions times frequencies, in bfloat16 as well,
    and the gradient through sin and cos (their backward rules call these ones)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    positions = torch.arange(4096).float()

    def table(p, f, dtype):
        angles = torch.outer(p, f)
        return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)

    for dtype in (torch.float32, torch.bfloat16):
        actual = compile_tpu(table)(positions, inv_freq, dtype)
        expected = table(positions, inv_freq, dtype)
        tol = dict(rtol=2.4e-7, atol=0) if dtype == torch.float32 else dict(rtol=7.9e-3, atol=0)
        torch.testing.assert_close(actual, expected, **tol)

    x = torch.linspace(-20, 20, 257, requires_grad=True)
    (x.sin() * x.cos().exp()).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    compiled = compile_tpu(lambda v: (v.sin() * v.cos().exp()).sum())
    compiled(x).backward()
    torch.testing.assert_close(x.grad, expected, rtol=1e-5, atol=1e-6)


def test_only_the_cpu_target_takes_the_reduced_form():
    """A TPU (or portable) program keeps XLA's own sine and cosine, which those targets vectorize."""
    fn = lambda v: v.sin() + v.cos()  # noqa: E731
    example = torch.randn(64)
    cpu = torchtpu.export(fn, example, platforms=("cpu",)).stablehlo_text()
    tpu = torchtpu.export(fn, example, platforms=("tpu",)).stablehlo_text()
    assert "stablehlo.case" in cpu or "stablehlo.if" in cpu
    assert "stablehlo.round_nearest_even" in cpu
    assert "round_nearest_even" not in tpu and "stablehlo.sine" in tpu and "stablehlo.cosine" in tpu
